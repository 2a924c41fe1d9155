// The step-time model against formulas written out here, and Plan()'s
// properties: every strategy's memory is Estimate's, the ranking is by
// tokens/s among those that fit, each knob set stops at its largest fitting
// micro-batch.
#include <cmath>

#include <gtest/gtest.h>

#include "vramscope/estimate.h"
#include "vramscope/plan.h"

namespace vramscope {
namespace {

double LinearWeights(const ModelSpec& m) {
  double n = 0;
  for (const ParamTensor& p : m.params) n += p.is_linear_weight ? static_cast<double>(p.numel) : 0;
  return n + (m.tie_word_embeddings ? static_cast<double>(m.vocab_size * m.hidden_size) : 0);
}

TEST(StepTime, FullFineTuneIsSixFlopsPerWeightAndToken) {
  auto model = LoadCatalogModel("llama-3-8b");
  auto gpu = FindGpu("h100-80g");
  ASSERT_TRUE(model.ok() && gpu.ok());
  TrainingSetup s;
  s.precision = Precision::kBf16Mixed;  // fp32 master weights (the formula below)
  s.batch = 2;
  s.seq = 1024;
  s.grad_accum = 3;
  const double n = LinearWeights(*model);
  const double tokens = 2.0 * 1024 * 3;
  // Causal SDPA: 4·layers·seq²·width per sample forward, halved.
  const double attention = 3 * 4.0 * 32 * 2 * 1024.0 * 1024.0 * 4096 * 0.5;
  const StepTime t = EstimateStepTime(*model, s, *gpu, model->ParameterCount());
  EXPECT_NEAR(t.forward_flops, 2 * n * tokens + attention, 1e-6 * t.forward_flops);
  EXPECT_NEAR(t.backward_flops, 4 * n * tokens + 2 * attention, 1e-6 * t.backward_flops);
  EXPECT_EQ(t.recompute_flops, 0);
  EXPECT_EQ(t.dequant_seconds, 0);
  const double rate =
      gpu->bf16_dense_tflops * 1e12 * kAchievableComputeFraction * (2048.0 / (2048 + 128));
  EXPECT_NEAR(t.compute_seconds, (t.forward_flops + t.backward_flops) / rate, 1e-9);
  // AdamW on fp32 master weights: 3 x 4 bytes (param r/w, grad r) + 4 x 4
  // (two moments r/w), plus 2 accumulations of 8 bytes (grad r/w).
  const double bytes = static_cast<double>(model->ParameterCount()) * (28 + 2 * 8);
  EXPECT_NEAR(t.optimizer_seconds,
              bytes / (gpu->memory_bandwidth_gbps * 1e9 * kAchievableBandwidthFraction), 1e-9);
  EXPECT_NEAR(t.tokens_per_second, tokens / t.step_seconds, 1e-6);
}

TEST(StepTime, KnobsMoveTimeTheWayTheyShould) {
  auto model = LoadCatalogModel("llama-3-8b");
  auto gpu = FindGpu("a100-80g");
  ASSERT_TRUE(model.ok() && gpu.ok());
  TrainingSetup full;
  const uint64_t all = model->ParameterCount();
  const StepTime base = EstimateStepTime(*model, full, *gpu, all);

  TrainingSetup ckpt = full;
  ckpt.grad_ckpt = GradCkpt::kFull;
  const StepTime c = EstimateStepTime(*model, ckpt, *gpu, all);
  // The decoder layers' forward again; the lm_head (128256 x 4096) is outside them.
  const double lm_head_flops = 2.0 * 128256 * 4096 * 2048;
  EXPECT_NEAR(c.recompute_flops, base.forward_flops - lm_head_flops, 1e-9 * base.forward_flops);
  EXPECT_NEAR(c.compute_seconds / base.compute_seconds, 4.0 / 3, 0.03) << "about +1/3 compute";

  TrainingSetup lora = full;
  lora.finetune = Finetune::kLora;
  const StepTime l = EstimateStepTime(*model, lora, *gpu, 6'815'744);
  EXPECT_LT(l.backward_flops, 0.55 * base.backward_flops) << "no frozen weight gradients";
  EXPECT_LT(l.optimizer_seconds, 0.01 * base.optimizer_seconds);

  TrainingSetup qlora = lora;
  qlora.finetune = Finetune::kQLora;
  const StepTime q = EstimateStepTime(*model, qlora, *gpu, 6'815'744);
  EXPECT_GT(q.dequant_seconds, 0);
  EXPECT_GT(q.step_seconds, l.step_seconds);

  TrainingSetup eight = full;
  eight.optimizer = OptimizerKind::kAdamW8bit;
  EXPECT_LT(EstimateStepTime(*model, eight, *gpu, all).optimizer_seconds, base.optimizer_seconds);

  TrainingSetup fp32 = full;
  fp32.precision = Precision::kFp32;
  EXPECT_NEAR(EstimateStepTime(*model, fp32, *gpu, all).compute_seconds / base.compute_seconds, 16,
              1e-6);

  TrainingSetup eager = full;
  eager.attn = Attention::kEager;
  EXPECT_GT(EstimateStepTime(*model, eager, *gpu, all).forward_flops, base.forward_flops);
}

TEST(Plan, StrategiesAreEstimatesRankedByTokensPerSecond) {
  auto model = LoadCatalogModel("qwen2.5-0.5b");
  ASSERT_TRUE(model.ok());
  TrainingSetup setup;
  setup.gpu = "rtx-4090";
  setup.seq = 1024;
  PlanOptions options;
  options.tokens_per_step = 16 * 1024;
  auto plan = Plan(*model, setup, options);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  // Knob sets: full fine-tune with fp32 and with bf16 weights, LoRA, QLoRA.
  EXPECT_EQ(plan->considered, 4u * 2 * 2 * 2 * 2 * 5) << "knob sets x splits 16, 8, 4, 2, 1";
  EXPECT_EQ(plan->estimates, plan->strategies.size());
  ASSERT_FALSE(plan->strategies.empty());
  bool seen_failing = false;
  double last_speed = INFINITY;
  for (const Strategy& s : plan->strategies) {
    EXPECT_EQ(s.setup.batch * s.setup.grad_accum * s.setup.seq, options.tokens_per_step);
    if (!s.fits) {
      seen_failing = true;
      continue;
    }
    EXPECT_FALSE(seen_failing) << "a fitting strategy ranked below one that does not fit";
    // Speeds within half a percent tie (then memory decides).
    EXPECT_LE(s.time.tokens_per_second, last_speed * 1.006);
    last_speed = s.time.tokens_per_second;
  }
  // Spot-check memory against independent estimates.
  for (size_t i = 0; i < plan->strategies.size(); i += 7) {
    const Strategy& s = plan->strategies[i];
    auto est = Estimate(*model, s.setup);
    ASSERT_TRUE(est.ok());
    EXPECT_EQ(s.device_total_bytes, FullDeviceTotalBytes(est->report.worst()));
    EXPECT_EQ(s.fits, est->report.fits());
  }
  EXPECT_FALSE(plan->explanation.empty());
  EXPECT_EQ(plan->explanation.front().rfind("#1: ", 0), 0u) << plan->explanation.front();
}

TEST(Plan, EachKnobSetStopsAtItsLargestFittingSplit) {
  auto model = LoadCatalogModel("smollm2-360m");
  ASSERT_TRUE(model.ok());
  TrainingSetup setup;
  setup.gpu = "t4";
  setup.seq = 2048;
  PlanOptions options;
  options.keep_finetune = true;  // full fine-tune only
  auto plan = Plan(*model, setup, options);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  const auto same_knob_set = [](const TrainingSetup& a, const TrainingSetup& b) {
    return a.grad_ckpt == b.grad_ckpt && a.optimizer == b.optimizer && a.loss == b.loss &&
           a.alloc_conf == b.alloc_conf;
  };
  for (const Strategy& s : plan->strategies) {
    EXPECT_EQ(s.setup.finetune, Finetune::kFull);
    if (!s.fits || s.setup.batch == 16) continue;
    // Only the largest fitting split of a knob set must have its next larger
    // split estimated and failing; smaller fitting ones may be listed too.
    bool largest = true, larger_failed = false;
    for (const Strategy& o : plan->strategies) {
      if (!same_knob_set(o.setup, s.setup)) continue;
      largest &= !(o.fits && o.setup.batch > s.setup.batch);
      larger_failed |= !o.fits && o.setup.batch == 2 * s.setup.batch;
    }
    if (largest) {
      EXPECT_TRUE(larger_failed) << s.setup.batch;
    }
  }
}

TEST(Plan, NothingFitsSaysSo) {
  auto model = LoadCatalogModel("llama-3-8b");
  ASSERT_TRUE(model.ok());
  TrainingSetup setup;
  setup.gpu = "t4";
  PlanOptions options;
  options.keep_finetune = true;
  options.tokens_per_step = 2048;
  auto plan = Plan(*model, setup, options);
  ASSERT_TRUE(plan.ok());
  for (const Strategy& s : plan->strategies) EXPECT_FALSE(s.fits);
  ASSERT_FALSE(plan->explanation.empty());
  EXPECT_EQ(plan->explanation.front().rfind("No strategy fits", 0), 0u);
}

TEST(Plan, BadInputsAreErrors) {
  auto model = LoadCatalogModel("gpt2");
  ASSERT_TRUE(model.ok());
  TrainingSetup setup;
  setup.seq = 512;
  PlanOptions options;
  options.tokens_per_step = 1000;
  auto r = Plan(*model, setup, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.rfind("--tokens-per-step:", 0), 0u);
  setup.gpu = "nope";
  EXPECT_FALSE(Plan(*model, setup, {}).ok());
}

}  // namespace
}  // namespace vramscope
