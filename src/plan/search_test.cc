// FindLargestFitting on synthetic memory curves: the answer equals a brute-force
// scan, the boundary holds (max fits, max + 1 does not), and the probe count
// stays within the documented bound.
#include "search.h"

#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace vramscope::plan_internal {
namespace {

constexpr uint64_t kLimit = 80'000'000'000;

// A curve of needed bytes per value; fits when needed <= limit.
struct Curve {
  explicit Curve(std::function<uint64_t(uint64_t)> needed_bytes, uint64_t limit_bytes = kLimit)
      : needed(std::move(needed_bytes)), limit(limit_bytes) {}

  std::function<uint64_t(uint64_t)> needed;
  uint64_t limit;
  std::set<uint64_t> probed;

  Probe AsProbe() {
    return [this](uint64_t x) -> Result<ProbeResult> {
      probed.insert(x);
      const uint64_t n = needed(x);
      return ProbeResult{n <= limit, n};
    };
  }
  uint64_t BruteForce(uint64_t cap) const {
    uint64_t best = 0;
    for (uint64_t x = 1; x <= cap && needed(x) <= limit; ++x) best = x;
    return best;
  }
};

uint64_t Bound(uint64_t cap) {
  return 2 * static_cast<uint64_t>(std::ceil(std::log2(static_cast<double>(cap) + 1))) +
         kMaxInterpolationProbes + 2;
}

void ExpectBoundary(Curve& curve, uint64_t start, uint64_t cap) {
  auto r = FindLargestFitting(start, cap, curve.limit, curve.AsProbe());
  ASSERT_TRUE(r.ok());
  const uint64_t expected = curve.BruteForce(cap);
  EXPECT_EQ(r->max_value, expected) << "start " << start << " cap " << cap;
  EXPECT_EQ(r->capped, expected == cap);
  if (expected > 0 && expected < cap) {
    EXPECT_TRUE(curve.probed.count(expected + 1)) << "max + 1 was never shown not to fit";
    EXPECT_EQ(r->next_needed_bytes, curve.needed(expected + 1));
  }
  EXPECT_LE(r->probes, Bound(cap));
  EXPECT_EQ(r->probes, curve.probed.size()) << "a value was probed twice";
  EXPECT_FALSE(r->non_monotone);
}

TEST(FindLargestFitting, LinearCurveNeedsFewProbes) {
  // 20 GB fixed + 2.5 GB per unit: boundary at 24.
  Curve curve{[](uint64_t x) { return 20'000'000'000 + 2'500'000'000 * x; }};
  auto r = FindLargestFitting(1, 65536, kLimit, curve.AsProbe());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->max_value, 24u);
  EXPECT_LE(r->probes, 5u) << "interpolation should land on the boundary";
}

TEST(FindLargestFitting, MatchesBruteForceOnShapes) {
  const std::vector<std::function<uint64_t(uint64_t)>> shapes = {
      [](uint64_t x) { return 1'000'000 * x; },                       // linear from 0
      [](uint64_t x) { return 30'000'000'000 + 7'000'000 * x * x; },  // quadratic (eager attention)
      [](uint64_t x) {
        return 40'000'000'000 + (x / 64) * 3'000'000'000;
      },                                                         // steps (allocator rounding)
      [](uint64_t x) { return 79'999'999'999 + x / 1000; },      // almost flat
      [](uint64_t x) { return x < 1000 ? 1'000 : kLimit + 1; },  // a cliff
      [](uint64_t) { return uint64_t{5}; },                      // everything fits
      [](uint64_t) { return kLimit + 1; },                       // nothing fits
      [](uint64_t x) { return static_cast<uint64_t>(5e10 * std::log2(1.0 + x)); },  // concave
  };
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (uint64_t cap : {1u, 2u, 7u, 1000u, 8192u, 65536u}) {
      for (uint64_t start : {1u, 2u, 5u, 2048u, 100000u}) {
        SCOPED_TRACE(testing::Message() << "shape " << i);
        Curve curve{shapes[i]};
        ExpectBoundary(curve, start, cap);
      }
    }
  }
}

TEST(FindLargestFitting, RandomMonotoneCurves) {
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 300; ++trial) {
    // Random non-negative increments: runs of zeros, small and large jumps.
    const uint64_t cap = 1 + rng() % 5000;
    std::vector<uint64_t> table(cap + 2);
    table[0] = rng() % 50'000'000'000;
    for (size_t x = 1; x < table.size(); ++x) {
      const uint64_t kind = rng() % 4;
      const uint64_t step = kind == 0   ? 0
                            : kind == 1 ? rng() % 1'000'000
                            : kind == 2 ? rng() % 100'000'000
                                        : rng() % 5'000'000'000;
      table[x] = table[x - 1] + step;
    }
    Curve curve{[table](uint64_t x) { return table[x]; }};
    ExpectBoundary(curve, 1 + rng() % (cap + 10), cap);
  }
}

TEST(FindLargestFitting, NothingFitsCostsTwoProbes) {
  Curve curve{[](uint64_t) { return kLimit * 2; }};
  auto r = FindLargestFitting(2048, 8192, kLimit, curve.AsProbe());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->max_value, 0u);
  EXPECT_FALSE(r->capped);
  EXPECT_EQ(r->probes, 2u);
  EXPECT_EQ(curve.probed, (std::set<uint64_t>{1, 2048}));
}

TEST(FindLargestFitting, ReportsNonMonotoneMemory) {
  // 1 needs more than 2: the doubling step sees a larger value needing less.
  Curve curve{[](uint64_t x) -> uint64_t { return x == 1 ? 600 : x * 100; }, 1000};
  auto r = FindLargestFitting(1, 100, 1000, curve.AsProbe());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->max_value, 10u);
  EXPECT_TRUE(r->non_monotone);
}

TEST(FindLargestFitting, ProbeErrorEndsTheSearch) {
  int calls = 0;
  Probe probe = [&](uint64_t x) -> Result<ProbeResult> {
    ++calls;
    if (x > 8) return MakeError("--batch " + std::to_string(x) + ": boom");
    return ProbeResult{true, x};
  };
  auto r = FindLargestFitting(1, 1000, kLimit, probe);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.rfind("--batch ", 0), 0u);
  EXPECT_NE(r.error().message.find(": boom"), std::string::npos);
  EXPECT_LE(calls, 4) << "the search went on after an error";
}

}  // namespace
}  // namespace vramscope::plan_internal
