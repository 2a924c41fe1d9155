// Mixture-of-experts routing knobs: tokens per expert against the formulas
// (dropless even split, busiest expert at R x its share, capacity
// ceil(F * t * k / E)), and the expert inputs the lowering allocates.
#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "transformer.h"
#include "vramscope/lower.h"

namespace vramscope::lower {
namespace {

TEST(Moe, DroplessEvenSplitKeepsEveryTokenExpertPair) {
  const auto t = ExpertTokens(/*tokens=*/1000, /*top_k=*/2, /*experts=*/8, /*ep=*/1, 0, 1);
  ASSERT_EQ(t.size(), 8u);
  uint64_t total = 0;
  for (uint64_t n : t) total += n;
  EXPECT_GE(total, 2000u);             // ceil per expert: never fewer pairs
  EXPECT_LE(total, 2000u + 8);
  EXPECT_EQ(t[0], 250u);               // 1000 * 2 / 8
}

TEST(Moe, ImbalanceLoadsTheBusiestExpert) {
  const auto t = ExpertTokens(1000, 2, 8, 1, 0, 3.0);
  EXPECT_EQ(t[0], 750u);               // 3 x 250
  EXPECT_EQ(t[1], (2000u - 750u + 6) / 7);
  // A token visits an expert at most once: the busiest holds at most t.
  EXPECT_EQ(ExpertTokens(1000, 2, 8, 1, 0, 100.0)[0], 1000u);
  // Expert parallel: the worst rank's experts are all that busy.
  const auto ep = ExpertTokens(1000, 2, 2, 4, 0, 2.0);
  EXPECT_EQ(ep[0], 2000u);             // 2 x (1000 * 2 / 2)
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

// Bytes of the expert inputs (hidden_states[top_x], [n, h] in bf16) that one
// step's forward allocates, keyed by size.
std::map<uint64_t, int> ExpertInputs(const TrainingSetup& s) {
  auto m = ParseModelConfig(kTinyMixtral, "tiny-mixtral");
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  GpuSpec gpu;
  gpu.usable_bytes = uint64_t{80} << 30;
  auto lowered = LowerTraining(*m, s, gpu);
  EXPECT_TRUE(lowered.ok()) << (lowered.ok() ? "" : lowered.error().message);
  const EventStream& stream = lowered->stream;
  const uint32_t index_op = const_cast<EventStream&>(stream).Intern("aten::index");
  std::map<uint64_t, int> sizes;
  bool forward = false;
  for (const Event& e : stream.events()) {
    if (e.kind == EventKind::kPhase) forward = e.step == 1 && e.phase == Phase::kForward;
    if (forward && e.kind == EventKind::kAlloc && e.op == index_op && e.size_bytes % (64 * 2) == 0 &&
        e.size_bytes >= 64 * 2 * 8) {
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
  // Dropless even: 4 experts x 2 layers, 128 * 2 / 4 = 64 tokens each.
  EXPECT_EQ(ExpertInputs(s), (std::map<uint64_t, int>{{64 * 64 * 2, 8}}));
  // Capacity 1.5: ceil(1.5 * 64) = 96 tokens each.
  s.moe_capacity_factor = 1.5;
  EXPECT_EQ(ExpertInputs(s), (std::map<uint64_t, int>{{96 * 64 * 2, 8}}));
  // Imbalance 2: the busiest 128 tokens, the other three (256 - 128) / 3.
  s.moe_capacity_factor = 0;
  s.moe_imbalance = 2;
  EXPECT_EQ(ExpertInputs(s), (std::map<uint64_t, int>{{128 * 64 * 2, 2}, {43 * 64 * 2, 6}}));
}

}  // namespace
}  // namespace vramscope::lower
