// The step-time model (step_time.cc) against published training throughput
// of named configurations. Each row is a figure someone measured and
// published, with its source; the model's constants were not fitted to them.
// The table this prints is the one in docs/plan.md ("How far off is it?").
//
// Multi-GPU rows: MosaicML's llm-foundry benchmarks ran FSDP FULL_SHARD on 8
// GPUs of one node. Per GPU that is the same forward, backward and recompute
// as one GPU training its own micro-batch (data parallel), plus
// all-gathers and reduce-scatters that FSDP overlaps with compute (not
// modelled), and an optimizer step over its 1/8 shard of the parameters,
// which is what `optimizer_share` passes.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "vramscope/gpu.h"
#include "vramscope/model.h"
#include "vramscope/plan.h"

namespace vramscope {
namespace {

// MPT as llm-foundry's benchmark ran it (scripts/train/yamls/pretrain/
// mpt-*.yaml with the defaults of MPTConfig: biases on, learned position
// embeddings, tied embeddings, 4x MLP) has GPT-2's shape: 12·d² matmul
// weights per layer. Written as a GPT-2 config.json with MPT's sizes; the
// published NumParams column checks that it is the same model.
std::string MptConfig(uint64_t d_model, uint64_t n_heads, uint64_t n_layers, uint64_t seq) {
  return fmt::format(
      R"({{"model_type": "gpt2", "n_embd": {}, "n_head": {}, "n_layer": {}, "n_positions": {},
          "vocab_size": 50368}})",
      d_model, n_heads, n_layers, seq);
}

struct Published {
  std::string name;                   // the configuration in words
  std::string model_config;           // config.json text, or empty for `catalog`
  std::string catalog;                // catalog alias
  uint64_t published_parameters = 0;  // the source's parameter count (0: not given)
  std::string gpu;
  Precision precision = Precision::kBf16Mixed;
  uint64_t batch = 1, seq = 2048, grad_accum = 1;
  GradCkpt grad_ckpt = GradCkpt::kNone;
  double optimizer_share = 1;              // share of the parameters this GPU's optimizer steps
  double published_tokens_per_second = 0;  // per GPU
  std::string source;
};

constexpr const char* kMosaicH100 =
    "llm-foundry scripts/train/benchmarking/README.md, \"H100 80GB BF16\"";
constexpr const char* kMosaicA100 =
    "llm-foundry scripts/train/benchmarking/README.md, \"A100 80GB with 1600 Gbps node-node "
    "interconnect (RoCE)\"";

Published Mpt(std::string size, uint64_t d, uint64_t heads, uint64_t layers, uint64_t params,
              std::string gpu, uint64_t seq, uint64_t micro_batch, uint64_t grad_accum, bool ckpt,
              double tokens_per_second) {
  Published p;
  const bool h100 = gpu == "h100-80g";
  p.name = fmt::format("MPT-{}, 8x{}, FSDP, seq {}, micro-batch {} x {}{}", size,
                       h100 ? "H100" : "A100-80GB", seq, micro_batch, grad_accum,
                       ckpt ? ", act. ckpt" : "");
  p.model_config = MptConfig(d, heads, layers, seq);
  p.published_parameters = params;
  p.gpu = std::move(gpu);
  p.seq = seq;
  p.batch = micro_batch;
  p.grad_accum = grad_accum;
  p.grad_ckpt = ckpt ? GradCkpt::kFull : GradCkpt::kNone;
  p.optimizer_share = 1.0 / 8;
  p.published_tokens_per_second = tokens_per_second;
  p.source = h100 ? kMosaicH100 : kMosaicA100;
  return p;
}

// Every 8-GPU row at seq 2048 and 8192 of MPT-1B, 7B, 13B and 30B in both
// tables (there is no 8-GPU 13B row at 8192 for H100): not chosen for how
// well they agree. Arguments: d_model, heads, layers, the published
// NumParams, GPU, seq, micro-batch, accumulation, activation checkpointing,
// Throughput (T/s/GPU).
std::vector<Published> PublishedFigures() {
  std::vector<Published> rows = {
      Mpt("1B", 2048, 16, 24, 1315950592, "h100-80g", 2048, 14, 1, false, 45455),
      Mpt("7B", 4096, 32, 32, 6658859008, "h100-80g", 2048, 6, 1, false, 10643),
      Mpt("13B", 5120, 40, 40, 12853954560, "h100-80g", 2048, 2, 1, false, 4792),
      Mpt("30B", 7168, 56, 48, 29975214080, "h100-80g", 2048, 3, 21, true, 2002),
      Mpt("1B", 2048, 16, 24, 1328533504, "h100-80g", 8192, 3, 4, false, 29157),
      Mpt("7B", 4096, 32, 32, 6684024832, "h100-80g", 8192, 8, 2, true, 6935),
      Mpt("30B", 7168, 56, 48, 30019254272, "h100-80g", 8192, 1, 21, true, 1384),
      Mpt("1B", 2048, 16, 24, 1315950592, "a100-80g", 2048, 14, 4, false, 20513),
      Mpt("7B", 4096, 32, 32, 6658859008, "a100-80g", 2048, 6, 2, false, 4641),
      Mpt("13B", 5120, 40, 40, 12853954560, "a100-80g", 2048, 2, 3, false, 2262),
      Mpt("30B", 7168, 56, 48, 29975214080, "a100-80g", 2048, 3, 21, true, 916),
      Mpt("1B", 2048, 16, 24, 1328533504, "a100-80g", 8192, 3, 4, false, 13814),
      Mpt("7B", 4096, 32, 32, 6684024832, "a100-80g", 8192, 8, 2, true, 3206),
      Mpt("13B", 5120, 40, 40, 12885411840, "a100-80g", 8192, 5, 3, true, 1795),
      Mpt("30B", 7168, 56, 48, 30019254272, "a100-80g", 8192, 1, 21, true, 574),
  };
  // torchtune README, "Optimization flags": full_finetune_single_device,
  // Llama 3.2 3B, batch 2, max seq len 4096, bf16, one A100; the row
  // "+ Packed Dataset" (every sequence 4096 tokens, no compile, no
  // checkpointing, torch.optim.AdamW). 60.0 GiB peak: the 80 GB A100.
  Published t;
  t.name = "Llama 3.2 3B, 1xA100-80GB, pure bf16, batch 2 x seq 4096 (packed)";
  t.catalog = "llama-3.2-3b";
  t.gpu = "a100-80g";
  t.precision = Precision::kBf16;
  t.batch = 2;
  t.seq = 4096;
  t.published_tokens_per_second = 7075;
  t.source = "torchtune README.md, \"Optimization flags\", row \"+ Packed Dataset\"";
  rows.push_back(t);
  return rows;
}

// The stated error (docs/plan.md), as measured when these rows were added:
// the model predicts -46%..+31% of the published tokens/s, mean |error| 22%.
// It assumes 40% of peak (kAchievableComputeFraction) on every GPU and for
// attention as for matmuls; these runs reached 30-46% model FLOPs
// utilisation on H100 but 39-64% (mostly 54-64%) on A100, so it is close on
// H100 and too slow on A100; where attention weighs most on H100 (MPT-1B at
// seq 8192) it is too fast. The bounds guard against the model getting worse; they are not
// a target, and the constants were not fitted to these rows.
constexpr double kMostUnder = -0.50;     // predicted / published - 1, at least
constexpr double kMostOver = 0.35;       // at most
constexpr double kMeanTolerance = 0.25;  // on the mean of |error| over all rows

TEST(StepTimeAgainstPublished, WithinStatedError) {
  double sum_abs_error = 0;
  std::string table =
      "| configuration | published tokens/s/GPU | predicted | error |\n|---|---:|---:|---:|\n";
  const std::vector<Published> rows = PublishedFigures();
  for (const Published& p : rows) {
    SCOPED_TRACE(p.name + " (" + p.source + ")");
    auto model =
        p.catalog.empty() ? ParseModelConfig(p.model_config, p.name) : LoadCatalogModel(p.catalog);
    ASSERT_TRUE(model.ok()) << model.error().message;
    if (p.published_parameters != 0) {
      EXPECT_EQ(model->ParameterCount(), p.published_parameters) << "not the published model";
    }
    auto gpu = FindGpu(p.gpu);
    ASSERT_TRUE(gpu.ok());
    TrainingSetup s;
    s.precision = p.precision;
    s.batch = p.batch;
    s.seq = p.seq;
    s.grad_accum = p.grad_accum;
    s.grad_ckpt = p.grad_ckpt;
    const double trainable = static_cast<double>(model->ParameterCount()) * p.optimizer_share;
    const StepTime t = EstimateStepTime(*model, s, *gpu, static_cast<uint64_t>(trainable));
    const double error = t.tokens_per_second / p.published_tokens_per_second - 1;
    sum_abs_error += std::fabs(error);
    EXPECT_TRUE(error >= kMostUnder && error <= kMostOver)
        << "error " << error << ": predicted " << t.tokens_per_second << " tokens/s, published "
        << p.published_tokens_per_second;
    table += fmt::format("| {} | {:.0f} | {:.0f} | {:+.0f}% |\n", p.name,
                         p.published_tokens_per_second, t.tokens_per_second, 100 * error);
  }
  const double mean_abs_error = sum_abs_error / static_cast<double>(rows.size());
  EXPECT_LE(mean_abs_error, kMeanTolerance);
  table += fmt::format("\nMean |error| over {} rows: {:.0f}%\n", rows.size(), 100 * mean_abs_error);
  std::fputs(table.c_str(), stdout);
}

}  // namespace
}  // namespace vramscope
