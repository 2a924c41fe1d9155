// Sweep(): every point equals Estimate() for its knobs, in the documented
// order; bad axes and failing points are errors naming the flag.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "parallel_for.h"
#include "vramscope/estimate.h"
#include "vramscope/plan.h"

namespace vramscope {
namespace {

void ExpectPointIsEstimate(const ModelSpec& model, const TrainingSetup& setup,
                           const SweepResult& sweep, const SweepPoint& p) {
  TrainingSetup s = setup;
  for (size_t a = 0; a < sweep.axes.size(); ++a) s = WithKnob(s, sweep.axes[a].variable, p.at[a]);
  auto est = Estimate(model, s);  // default options: timeline and top allocations on
  ASSERT_TRUE(est.ok()) << est.error().message;
  const Report& r = est->report;
  // A point that does not fit carries its whole requirement.
  EXPECT_EQ(p.peak_allocated_bytes, FullPeakAllocatedBytes(r.worst()));
  EXPECT_EQ(p.peak_reserved_bytes, FullPeakReservedBytes(r.worst()));
  EXPECT_EQ(p.device_total_bytes, FullDeviceTotalBytes(r.worst()));
  EXPECT_EQ(p.oom, r.worst().full.has_value());
  EXPECT_EQ(p.needed_bytes, r.needed_bytes());
  EXPECT_EQ(p.fits, r.fits());
  EXPECT_EQ(p.oom, r.worst().sim.oom.has_value());
}

struct SweepCase {
  const char* model;
  TrainingSetup setup;
  std::vector<SweepAxis> axes;
};

TEST(Sweep, PointsEqualEstimate) {
  TrainingSetup lora;
  lora.finetune = Finetune::kLora;
  lora.lora_targets = {"all-linear"};
  lora.gpu = "rtx-4090";
  TrainingSetup fp32;
  fp32.precision = Precision::kFp32;
  fp32.attn = Attention::kEager;
  fp32.gpu = "t4";
  TrainingSetup big;  // llama-3-8b full fine-tune: no point fits an A100-40GB
  big.gpu = "a100-40g";
  const std::vector<SweepCase> cases = {
      {"qwen2.5-0.5b", TrainingSetup{}, {{SweepVariable::kSeq, {1, 512, 2048, 8192}}}},
      {"llama-3.2-1b",
       lora,
       {{SweepVariable::kBatch, {1, 2, 8}}, {SweepVariable::kLoraRank, {8, 64}}}},
      {"gpt2", fp32, {{SweepVariable::kSeq, {64, 1024}}, {SweepVariable::kBatch, {1, 16, 64}}}},
      {"smollm2-135m", TrainingSetup{}, {{SweepVariable::kGradAccum, {1, 4}}}},
      {"llama-3-8b", big, {{SweepVariable::kSeq, {1, 2048}}}},
  };
  for (const SweepCase& c : cases) {
    SCOPED_TRACE(c.model);
    auto model = LoadCatalogModel(c.model);
    ASSERT_TRUE(model.ok());
    auto sweep = Sweep(*model, c.setup, c.axes);
    ASSERT_TRUE(sweep.ok()) << sweep.error().message;
    size_t expected = 1;
    for (const SweepAxis& a : c.axes) expected *= a.values.size();
    ASSERT_EQ(sweep->points.size(), expected);
    for (const SweepPoint& p : sweep->points) ExpectPointIsEstimate(*model, c.setup, *sweep, p);
    EXPECT_EQ(sweep->gpu.name, c.setup.gpu);
    ASSERT_TRUE(sweep->model.has_value());
  }
}

TEST(Sweep, FirstAxisIsOutermost) {
  auto model = LoadCatalogModel("smollm2-135m");
  ASSERT_TRUE(model.ok());
  auto sweep = Sweep(*model, TrainingSetup{},
                     {{SweepVariable::kSeq, {128, 256}}, {SweepVariable::kBatch, {1, 2, 3}}});
  ASSERT_TRUE(sweep.ok());
  std::vector<std::vector<uint64_t>> order;
  for (const SweepPoint& p : sweep->points) order.push_back(p.at);
  EXPECT_EQ(order, (std::vector<std::vector<uint64_t>>{
                       {128, 1}, {128, 2}, {128, 3}, {256, 1}, {256, 2}, {256, 3}}));
  // Swept knobs show their grid among the knobs; the others their value.
  bool seen_seq = false;
  for (const auto& [key, value] : sweep->knobs) {
    if (key == "seq") {
      seen_seq = true;
      EXPECT_EQ(value, "128..256 (2 values)");
    }
  }
  EXPECT_TRUE(seen_seq);
}

TEST(Sweep, BadAxesAreErrors) {
  auto model = LoadCatalogModel("gpt2");
  ASSERT_TRUE(model.ok());
  const TrainingSetup s;
  EXPECT_FALSE(Sweep(*model, s, {}).ok());
  EXPECT_FALSE(Sweep(*model, s, {{SweepVariable::kSeq, {1}}, {SweepVariable::kSeq, {2}}}).ok());
  EXPECT_FALSE(Sweep(*model, s,
                     {{SweepVariable::kSeq, {1}},
                      {SweepVariable::kBatch, {1}},
                      {SweepVariable::kLoraRank, {1}}})
                   .ok());
  EXPECT_FALSE(Sweep(*model, s, {{SweepVariable::kSeq, {}}}).ok());
  EXPECT_FALSE(Sweep(*model, s, {{SweepVariable::kSeq, {4, 2}}}).ok());
  std::vector<uint64_t> many(101);
  for (size_t i = 0; i < many.size(); ++i) many[i] = i + 1;
  auto too_many = Sweep(*model, s, {{SweepVariable::kSeq, many}, {SweepVariable::kBatch, many}});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.error().message.find("10000"), std::string::npos);
}

TEST(Sweep, AFailingPointNamesItself) {
  auto model = LoadCatalogModel("gpt2");
  ASSERT_TRUE(model.ok());
  TrainingSetup s;
  s.finetune = Finetune::kLora;
  auto r = Sweep(*model, s, {{SweepVariable::kLoraRank, {8, 100000}}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.rfind("--lora-rank 100000: ", 0), 0u) << r.error().message;
}

// Points run on several threads; the error is still the first failing
// point's in grid order, whichever thread finished first.
TEST(Sweep, TheFirstFailingPointIsReported) {
  auto model = LoadCatalogModel("gpt2");
  ASSERT_TRUE(model.ok());
  TrainingSetup s;
  s.finetune = Finetune::kLora;
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto r =
        Sweep(*model, s, {{SweepVariable::kLoraRank, {8, 16, 100000, 200000, 300000, 400000}}});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message.rfind("--lora-rank 100000: ", 0), 0u) << r.error().message;
  }
}

TEST(ParallelFor, RunsEveryItemOnceAndStopsAfterAFailure) {
  std::vector<std::atomic<int>> runs(1000);
  plan_internal::ParallelFor(runs.size(), [&](size_t i) {
    ++runs[i];
    return true;
  });
  for (const auto& n : runs) EXPECT_EQ(n.load(), 1);

  // Item 10 fails: every item below it still ran.
  std::vector<std::atomic<int>> partial(1000);
  plan_internal::ParallelFor(partial.size(), [&](size_t i) {
    ++partial[i];
    return i != 10;
  });
  for (size_t i = 0; i <= 10; ++i) EXPECT_EQ(partial[i].load(), 1) << i;
}

TEST(ParallelFor, RethrowsAnExceptionAfterJoining) {
  std::atomic<int> ran{0};
  EXPECT_THROW(plan_internal::ParallelFor(100,
                                          [&](size_t i) {
                                            ++ran;
                                            if (i == 3) throw std::runtime_error("item 3");
                                            return true;
                                          }),
               std::runtime_error);
  EXPECT_GE(ran.load(), 4);
}

}  // namespace
}  // namespace vramscope
