// Long randomized malloc/free streams: every invariant after every
// operation, plus properties the caller relies on (no two live blocks
// overlap, block sizes cover requests, reserved stays under the limit).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <unordered_map>
#include <vector>

#include "test_support.h"

namespace vramscope::testing {
namespace {

struct StreamCase {
  const char* name;
  const char* conf;
  uint64_t device_limit_bytes;
  uint32_t streams;
  uint64_t seed;
};

void PrintTo(const StreamCase& c, std::ostream* os) { *os << c.name << "/seed" << c.seed; }

// Sizes from 1 B to 1 GiB, log-uniform within three bands, plus zero-byte
// requests and a few repeated "activation" sizes.
uint64_t DrawSize(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const double band = unit(rng);
  if (band < 0.01) return 0;
  if (band < 0.20) {
    static constexpr uint64_t kRepeated[] = {512, 4 * KiB, 3 * MiB, 24 * MiB, 96 * MiB};
    return kRepeated[rng() % 5];
  }
  double lo = 0, hi = 20;             // 1 B .. 1 MiB
  if (band > 0.55) lo = 20, hi = 26;  // 1 MiB .. 64 MiB
  if (band > 0.93) lo = 26, hi = 30;  // 64 MiB .. 1 GiB
  return std::max<uint64_t>(1, static_cast<uint64_t>(std::exp2(lo + (hi - lo) * unit(rng))));
}

class RandomStream : public ::testing::TestWithParam<StreamCase> {};

TEST_P(RandomStream, InvariantsHoldAfterEveryOperation) {
  const StreamCase& c = GetParam();
  Result<AllocatorConfig> config = ParseAllocConf(c.conf);
  ASSERT_TRUE(config.ok());
  CachingAllocator a(config.value(), c.device_limit_bytes);
  std::mt19937_64 rng(c.seed);
  struct Live {
    BlockHandle handle;
    uint64_t requested_bytes;
    uint64_t address;
  };
  std::vector<Live> live;
  uint64_t ooms = 0, expected_allocated = 0;
  constexpr int kOperations = 100'000;
  for (int op = 0; op < kOperations; ++op) {
    const uint64_t dice = rng() % 1000;
    if (dice == 0) {
      a.EmptyCache();
    } else if (dice == 1) {
      a.ResetPeaks();
    } else if (!live.empty() && (live.size() >= 300 || dice < 480)) {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(a.IsAllocated(live[i].handle));
      ASSERT_EQ(a.BlockAddress(live[i].handle), live[i].address) << "a live block moved";
      expected_allocated -= a.BlockSize(live[i].handle);
      a.Free(live[i].handle);
      live[i] = live.back();
      live.pop_back();
    } else {
      const uint64_t bytes = DrawSize(rng);
      const uint32_t stream = static_cast<uint32_t>(rng() % c.streams);
      const uint64_t ooms_before = a.stats().num_ooms;
      std::optional<BlockHandle> h = a.Malloc(bytes, stream);
      if (h) {
        const uint64_t size = a.BlockSize(*h);
        if (bytes > 0) {
          ASSERT_GE(size, config->ideal ? bytes : RoundSize(bytes, *config));
        }
        expected_allocated += size;
        live.push_back({*h, bytes, a.BlockAddress(*h)});
      } else {
        ++ooms;
        ASSERT_TRUE(a.last_oom().has_value());
        ASSERT_EQ(a.stats().num_ooms, ooms_before + 1);
        ASSERT_EQ(a.last_oom()->requested_bytes, bytes);
      }
    }
    Status s = a.CheckInvariants();
    ASSERT_TRUE(s.ok()) << "operation " << op << ": " << s.error().message;
    ASSERT_EQ(a.stats().allocated_bytes, expected_allocated) << "operation " << op;
    ASSERT_LE(a.stats().reserved_bytes, c.device_limit_bytes);
    if (op % 997 == 0) {
      // Live blocks never overlap.
      std::vector<std::pair<uint64_t, uint64_t>> extents;
      for (const Live& l : live) {
        if (l.requested_bytes > 0) extents.emplace_back(l.address, a.BlockSize(l.handle));
      }
      std::sort(extents.begin(), extents.end());
      for (size_t i = 1; i < extents.size(); ++i) {
        ASSERT_LE(extents[i - 1].first + extents[i - 1].second, extents[i].first);
      }
    }
  }
  // Freeing everything and emptying the cache returns every byte.
  for (const Live& l : live) a.Free(l.handle);
  a.EmptyCache();
  ASSERT_TRUE(a.CheckInvariants().ok());
  EXPECT_EQ(a.stats().allocated_bytes, 0u);
  EXPECT_EQ(a.stats().reserved_bytes, 0u);
  EXPECT_EQ(a.stats().num_segments, 0u);
  if (c.device_limit_bytes != kUnlimited) {
    EXPECT_GT(ooms, 0u) << "the limit should cause OOMs";
  }
  RecordProperty("ooms", static_cast<int>(ooms));
  RecordProperty("alloc_retries", static_cast<int>(a.stats().num_alloc_retries));
  RecordProperty("device_frees", static_cast<int>(a.stats().num_device_free));
  RecordProperty("peak_reserved_mib", static_cast<int>(a.stats().peak_reserved_bytes >> 20));
}

constexpr uint64_t kLimit = 6 * GiB;

std::vector<StreamCase> Cases() {
  const StreamCase base[] = {
      {"default_unlimited", "", kUnlimited, 3, 0},
      {"default_limited", "", kLimit, 2, 0},
      {"expandable_unlimited", "expandable_segments:True", kUnlimited, 3, 0},
      {"expandable_limited", "expandable_segments:True", kLimit, 3, 0},
      {"max_split_limited", "max_split_size_mb:256", kLimit, 2, 0},
      {"gc_fraction_max_split",
       "garbage_collection_threshold:0.5,per_process_memory_fraction:0.8,"
       "max_split_size_mb:128",
       kLimit, 2, 0},
      {"expandable_max_split_gc",
       "expandable_segments:True,max_split_size_mb:64,"
       "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9",
       kLimit, 2, 0},
      {"roundup_list", "roundup_power2_divisions:[1:4,64:8,>:2]", kLimit, 2, 0},
      {"ideal", "ideal:True", kLimit, 2, 0},
  };
  std::vector<StreamCase> out;
  for (const StreamCase& c : base) {
    for (uint64_t seed : {1, 2, 3}) {
      StreamCase s = c;
      s.seed = seed;
      out.push_back(s);
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomStream, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<StreamCase>& info) {
                           return std::string(info.param.name) + "_seed" +
                                  std::to_string(info.param.seed);
                         });

}  // namespace
}  // namespace vramscope::testing
