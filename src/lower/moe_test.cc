// Mixture-of-experts routing knobs: tokens per expert against the formulas
// (dropless even split, busiest expert at R x its share, capacity
// ceil(F * t * k / E)), and the expert inputs the lowering allocates.
#include <cmath>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "transformer.h"
#include "vramscope/lower.h"
#include "vramscope/simulate.h"

namespace vramscope::lower {
namespace {

TEST(Moe, DroplessEvenSplitKeepsEveryTokenExpertPair) {
  const auto t = ExpertTokens(/*tokens=*/1000, /*top_k=*/2, /*experts=*/8, /*ep=*/1, 0, 1);
  ASSERT_EQ(t.size(), 8u);
  uint64_t total = 0;
  for (uint64_t n : t) total += n;
  EXPECT_GE(total, 2000u);  // ceil per expert: never fewer pairs
  EXPECT_LE(total, 2000u + 8);
  EXPECT_EQ(t[0], 250u);  // 1000 * 2 / 8
}

TEST(Moe, ImbalanceLoadsTheBusiestExpert) {
  const auto t = ExpertTokens(1000, 2, 8, 1, 0, 3.0);
  EXPECT_EQ(t[0], 750u);  // 3 x 250
  EXPECT_EQ(t[1], (2000u - 750u + 6) / 7);
  // A token visits an expert at most once: the busiest holds at most t.
  EXPECT_EQ(ExpertTokens(1000, 2, 8, 1, 0, 100.0)[0], 1000u);
  // Expert parallel: the worst rank's experts are all that busy.
  const auto ep = ExpertTokens(1000, 2, 2, 4, 0, 2.0);
  EXPECT_EQ(ep[0], 2000u);  // 2 x (1000 * 2 / 2)
  EXPECT_EQ(ep[1], 2000u);
}

TEST(Moe, CapacityPadsEveryExpert) {
  const auto t = ExpertTokens(1000, 2, 8, 1, 1.25, 1);
  for (uint64_t n : t) EXPECT_EQ(n, static_cast<uint64_t>(std::ceil(1.25 * 250)));
}

constexpr const char* kTinyMixtral = R"({
  "model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
  "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
  "num_local_experts": 4, "num_experts_per_tok": 2,
  "max_position_embeddings": 512, "tie_word_embeddings": false, "torch_dtype": "bfloat16"
})";

// The event stream of `config` lowered with `s` on an 80 GiB GPU.
EventStream LowerTiny(const TrainingSetup& s, const char* config = kTinyMixtral) {
  auto m = ParseModelConfig(config, "tiny-moe");
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  GpuSpec gpu;
  gpu.usable_bytes = uint64_t{80} << 30;
  auto lowered = LowerTraining(*m, s, gpu);
  EXPECT_TRUE(lowered.ok()) << (lowered.ok() ? "" : lowered.error().message);
  return lowered.ok() ? std::move(lowered->stream) : EventStream{};
}

// Bytes of the expert inputs (hidden_states[top_x], [n, h] in bf16) that one
// step's forward allocates, keyed by size.
std::map<uint64_t, int> ExpertInputs(const TrainingSetup& s) {
  EventStream stream = LowerTiny(s);
  const uint32_t index_op = stream.Intern("aten::index");
  std::map<uint64_t, int> sizes;
  bool forward = false;
  for (const Event& e : stream.events()) {
    if (e.kind == EventKind::kPhase) forward = e.step == 1 && e.phase == Phase::kForward;
    if (forward && e.kind == EventKind::kAlloc && e.op == index_op &&
        e.size_bytes % (64 * 2) == 0 && e.size_bytes >= 64 * 2 * 8) {
      ++sizes[e.size_bytes];
    }
  }
  return sizes;
}

TEST(Moe, LoweringAllocatesTheRoutedTokens) {
  TrainingSetup s;
  s.batch = 1;
  s.seq = 128;
  s.steps = 1;
  s.precision = Precision::kBf16;
  s.transformers_version = 457;  // the per-expert loop of transformers 4.x
  // Dropless even: 4 experts x 2 layers, 128 * 2 / 4 = 64 tokens each. Each
  // expert also copies its [k, t] int64 slice of the one-hot mask
  // (expert_mask[expert_idx], 2 * 128 * 8 bytes) before torch.where.
  const std::pair<const uint64_t, int> mask_slice{2 * 128 * 8, 8};
  EXPECT_EQ(ExpertInputs(s), (std::map<uint64_t, int>{{64 * 64 * 2, 8}, mask_slice}));
  // Capacity 1.5: ceil(1.5 * 64) = 96 tokens each.
  s.moe_capacity_factor = 1.5;
  EXPECT_EQ(ExpertInputs(s), (std::map<uint64_t, int>{{96 * 64 * 2, 8}, mask_slice}));
  // Imbalance 2: the busiest 128 tokens, the other three (256 - 128) / 3.
  s.moe_capacity_factor = 0;
  s.moe_imbalance = 2;
  EXPECT_EQ(ExpertInputs(s),
            (std::map<uint64_t, int>{{128 * 64 * 2, 2}, {43 * 64 * 2, 6}, mask_slice}));
}

// transformers >= 5.0 (integrations/moe.py grouped_mm_experts_forward): the
// routed experts run as two grouped matmuls over all S = t * k (token, expert)
// pairs. Sizes written out for the tiny Mixtral (h = 64, I = 128, E = 4,
// k = 2, 2 layers) at 1 x 128 tokens in bf16: S = 256.
std::map<std::string, std::map<uint64_t, int>> ForwardAllocsByOp(
    const TrainingSetup& s, const char* config = kTinyMixtral) {
  const EventStream stream = LowerTiny(s, config);
  std::map<std::string, std::map<uint64_t, int>> by_op;
  bool forward = false;
  for (const Event& e : stream.events()) {
    if (e.kind == EventKind::kPhase) forward = e.step == 1 && e.phase == Phase::kForward;
    if (forward && e.kind == EventKind::kAlloc)
      ++by_op[std::string(stream.String(e.op))][e.size_bytes];
  }
  return by_op;
}

TrainingSetup GroupedSetup() {
  TrainingSetup s;
  s.batch = 1;
  s.seq = 128;
  s.steps = 1;
  s.precision = Precision::kBf16;
  s.transformers_version = 523;
  return s;
}

TEST(MoeGrouped, TwoGroupedMatmulsPerLayerOverAllPairs) {
  auto ops = ForwardAllocsByOp(GroupedSetup());
  const uint64_t s = 128 * 2, h = 64, inter = 128, bf16 = 2;
  // gate|up [S, 2I] and down [S, h], once per layer.
  EXPECT_EQ(ops["aten::_grouped_mm"],
            (std::map<uint64_t, int>{{s * 2 * inter * bf16, 2}, {s * h * bf16, 2}}));
  // Rows [S, h] (grouped_mm_experts_forward, 5.24.0): hidden_states[perm //
  // top_k], already in expert order, and the weighted rows back in token order;
  // the sorted routing weights. MixtralTopKRouter (5.24.0) does not cast its
  // top-k values back, so those weights and the weighted rows are fp32.
  // torch.sort returns the sorted ids itself: no index for them.
  EXPECT_EQ(ops["aten::index"],
            (std::map<uint64_t, int>{{s * h * bf16, 2}, {s * h * 4, 2}, {s * 4, 2}}));
  EXPECT_EQ(ops["aten::floor_divide"], (std::map<uint64_t, int>{{s * 8, 2}}));
  // The router: fp32 softmax over 4 experts, fp32 top-2 values, int64 indices.
  EXPECT_EQ(ops["aten::_softmax"], (std::map<uint64_t, int>{{128 * 4 * 4, 2}}));
  EXPECT_EQ(ops["aten::topk"], (std::map<uint64_t, int>{{128 * 2 * 4, 2}, {128 * 2 * 8, 2}}));
  // No per-expert loop and no one-hot expert mask any more.
  EXPECT_EQ(ops.count("aten::one_hot"), 0u);
  // act(gate) * up: [S, I] each, once per layer.
  EXPECT_EQ(ops["aten::silu"], (std::map<uint64_t, int>{{s * inter * bf16, 2}}));
}

// The experts' parameter storage at setup, by size (module names aside).
std::map<uint64_t, int> ExpertParamAllocs(const TrainingSetup& s) {
  const EventStream stream = LowerTiny(s);
  std::map<uint64_t, int> sizes;
  for (const Event& e : stream.events()) {
    if (e.kind == EventKind::kPhase) break;  // setup only
    if (e.kind == EventKind::kAlloc &&
        std::string(stream.String(e.module)).find(".experts.") != std::string::npos)
      ++sizes[e.size_bytes];
  }
  return sizes;
}

// transformers 5.x MixtralExperts: gate_up_proj [E, 2I, h] and down_proj
// [E, h, I], one storage each per layer; 4.x: one nn.Linear per expert matrix.
TEST(MoeGrouped, ExpertsAreTwoStackedStoragesPerLayer) {
  const uint64_t e = 4, h = 64, inter = 128, bf16 = 2;
  EXPECT_EQ(ExpertParamAllocs(GroupedSetup()),
            (std::map<uint64_t, int>{{e * 2 * inter * h * bf16, 2}, {e * h * inter * bf16, 2}}));
  TrainingSetup old = GroupedSetup();
  old.transformers_version = 457;
  EXPECT_EQ(ExpertParamAllocs(old), (std::map<uint64_t, int>{{inter * h * bf16, 2 * 3 * 4}}));
}

TEST(MoeGrouped, OlderReleasesKeepThePerExpertLoop) {
  TrainingSetup s = GroupedSetup();
  s.transformers_version = 457;
  auto ops = ForwardAllocsByOp(s);
  EXPECT_EQ(ops.count("aten::_grouped_mm"), 0u);
  // int64 one-hot mask [E, k, t] per layer.
  EXPECT_EQ(ops["aten::one_hot"], (std::map<uint64_t, int>{{4 * 2 * 128 * 8, 2}}));
}

TEST(MoeGrouped, StackedExpertsAreNoLoraTargets) {
  auto m = ParseModelConfig(kTinyMixtral, "tiny-moe");
  ASSERT_TRUE(m.ok());
  GpuSpec gpu;
  gpu.usable_bytes = uint64_t{80} << 30;
  TrainingSetup s = GroupedSetup();
  s.finetune = Finetune::kLora;
  s.lora_rank = 8;
  s.lora_targets = {"all-linear"};
  // Attention: q [64 -> 64], k, v [64 -> 32], o [64 -> 64]: r * (in + out) each.
  const uint64_t r = 8, attn = r * (64 + 64) * 2 + r * (64 + 32) * 2;
  // 4.x: every expert's gate, up [64 -> 128] and down [128 -> 64] too.
  const uint64_t experts = 4 * 3 * r * (64 + 128);
  auto v5 = LowerTraining(*m, s, gpu);
  ASSERT_TRUE(v5.ok()) << v5.error().message;
  EXPECT_EQ(v5->trainable_parameters, 2 * attn);
  s.transformers_version = 457;
  auto v4 = LowerTraining(*m, s, gpu);
  ASSERT_TRUE(v4.ok()) << v4.error().message;
  EXPECT_EQ(v4->trainable_parameters, 2 * (attn + experts));
}

// Both MoE paths give a training step that frees what it allocates: every
// expert's graph is reached from the loss (4.x through index_add_'s
// IndexAddBackward0), so step 2 and step 3 peak alike and only weights and
// AdamW's two moments remain after the last step.
TEST(Moe, BothPathsReachSteadyStateAndLeaveOnlyModelStates) {
  auto m = ParseModelConfig(kTinyMixtral, "tiny-moe");
  ASSERT_TRUE(m.ok()) << m.error().message;
  GpuSpec gpu;
  gpu.usable_bytes = uint64_t{80} << 30;
  gpu.cublas_workspace_bytes = 0;
  for (uint32_t version : {457u, 523u}) {
    for (GradCkpt ckpt : {GradCkpt::kNone, GradCkpt::kFull}) {
      TrainingSetup s;
      s.batch = 2;
      s.seq = 64;
      s.steps = 3;
      s.precision = Precision::kBf16;
      s.optimizer = OptimizerKind::kAdamW;
      s.grad_ckpt = ckpt;
      s.transformers_version = version;
      auto lowered = LowerTraining(*m, s, gpu);
      ASSERT_TRUE(lowered.ok()) << lowered.error().message;
      SimOptions o;
      o.alloc.ideal = true;
      auto r = Simulate(lowered->stream, o);
      ASSERT_TRUE(r.ok()) << r.error().message;
      ASSERT_EQ(r->phases.size(), 10u);
      for (int ph = 0; ph < 3; ++ph) {
        EXPECT_EQ(r->phases[4 + ph].peak_allocated_bytes, r->phases[7 + ph].peak_allocated_bytes)
            << "version " << version << " phase " << ph;
      }
      // bf16 weights and two bf16 AdamW moments: 3 x 2 bytes per parameter.
      EXPECT_EQ(r->final_stats.allocated_bytes, m->ParameterCount() * 2 * 3)
          << "version " << version;
    }
  }
}

}  // namespace
}  // namespace vramscope::lower
