// --liger (liger-kernel 0.8.5), checked with sizes worked out by hand from the
// kernels' Python code, not from the lowering's constants. Triton does not run
// on CPU, so there is no reference trace: these figures are the whole check.
#include <cstdint>
#include <string_view>

#include <gtest/gtest.h>

#include "test_models.h"

#include "vramscope/lower.h"

// A named namespace: the unity build joins test files.
namespace vramscope::liger_test {

using lower_testing::TestGpu;
using lower_testing::Tiny;

// The tiny model: h=256, i=688, 8 heads of 32 (2 kv heads), 4 layers; fp32,
// batch 1 x seq 32 = 32 tokens.
constexpr uint64_t kT = 32, kH = 256, kI = 688, kKv = 2 * 32, kL = 4, kSms = 4;

TrainingSetup Liger() {
  TrainingSetup s;
  s.batch = 1;
  s.seq = kT;
  s.steps = 1;
  s.precision = Precision::kFp32;
  s.optimizer = OptimizerKind::kSgd;
  s.liger = true;
  s.loss = LossKind::kFusedLinear;
  return s;
}

// Allocations of `op` made in `phase` of the first step: their count and
// the size of the last one.
struct Count {
  int n = 0;
  uint64_t bytes = 0;
};
Count Allocs(const EventStream& s, Phase want, std::string_view op) {
  Count c;
  Phase phase = Phase::kSetup;
  for (const Event& e : s.events()) {
    if (e.kind == EventKind::kPhase) phase = e.phase;
    if (e.kind == EventKind::kAlloc && phase == want && s.String(e.op) == op) {
      ++c.n;
      c.bytes = e.size_bytes;
    }
  }
  return c;
}

EventStream Lowered(const TrainingSetup& s) {
  GpuSpec gpu = TestGpu();
  gpu.sm_count = kSms;
  auto r = LowerTraining(Tiny(), s, gpu);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r->stream) : EventStream{};
}

// ops/rms_norm.py rms_norm_forward: Y = empty((n_rows, n_cols), X.dtype) and
// RSTD = empty(n_rows, float32) per call: input_layernorm and
// post_attention_layernorm per layer, then the final norm (2 x 4 + 1 = 9).
// rms_norm_backward: _dW = empty((sm_count, n_cols), float32) per call, and
// dX written into dY (no dX allocation); fp32 W: dW is _dW.sum(0), [h] fp32.
TEST(Liger, RmsNormAllocatesYAndFp32RstdAndAPerSmBuffer) {
  const EventStream s = Lowered(Liger());
  const Count y = Allocs(s, Phase::kForward, "liger::rms_norm");
  EXPECT_EQ(y.n, 2 * kL + 1);
  EXPECT_EQ(y.bytes, kT * kH * 4);
  const Count rstd = Allocs(s, Phase::kForward, "liger::rms_norm_rstd");
  EXPECT_EQ(rstd.n, 2 * kL + 1);
  EXPECT_EQ(rstd.bytes, kT * 4);
  // Backward: per norm the [4, 256] fp32 buffer (4096 B) and dW [256] fp32.
  const Count bw = Allocs(s, Phase::kBackward, "LigerRMSNormFunctionBackward");
  EXPECT_EQ(bw.n, 2 * (2 * kL + 1));
  EXPECT_EQ(bw.bytes, kH * 4);  // the last: dW (after _dW)
  // None of LlamaRMSNorm's fp32 copies, pow, mean or rsqrt.
  EXPECT_EQ(Allocs(s, Phase::kForward, "aten::rsqrt").n, 0);
}

// ops/swiglu.py swiglu_forward: c = empty_like(a), [t, i]; forward saves a
// and b (the gate_proj / up_proj outputs); swiglu_backward writes da and db
// over them: no allocation by LigerSiLUMulFunction's backward, and no silu
// output in forward.
TEST(Liger, SwigluAllocatesOneProductAndNothingInBackward) {
  const EventStream s = Lowered(Liger());
  const Count c = Allocs(s, Phase::kForward, "liger::swiglu");
  EXPECT_EQ(c.n, kL);
  EXPECT_EQ(c.bytes, kT * kI * 4);
  EXPECT_EQ(Allocs(s, Phase::kForward, "aten::silu").n, 0);
  EXPECT_EQ(Allocs(s, Phase::kBackward, "LigerSiLUMulFunctionBackward").n, 0);
}

// ops/rope.py: in place in forward (q / k are the projections' contiguous
// [b, s, heads, d] storage) and in backward under SDPA (its gradients have
// q's layout); under eager attention dq / dk arrive head-major and
// `.contiguous()` copies them: [t, 8 x 32] and [t, 2 x 32] fp32 per layer.
TEST(Liger, RopeIsInPlaceUnderSdpaAndCopiesEagerGradients) {
  EXPECT_EQ(Allocs(Lowered(Liger()), Phase::kBackward, "LigerRopeFunctionBackward").n, 0);
  TrainingSetup s = Liger();
  s.attn = Attention::kEager;
  const EventStream e = Lowered(s);
  const Count copies = Allocs(e, Phase::kBackward, "LigerRopeFunctionBackward");
  EXPECT_EQ(copies.n, 2 * kL);
  EXPECT_EQ(copies.bytes, kT * kKv * 4);  // the last: dk
  // No rotate_half pieces in forward.
  EXPECT_EQ(Allocs(e, Phase::kForward, "aten::neg").n, 0);
}

// The liger layer makes fewer tensors than transformers' modules: no
// silu(gate), no rotate_half pieces, no fp32 copies in the norms.
TEST(Liger, MakesFewerTensorsThanTransformersModules) {
  TrainingSetup hf = Liger();
  hf.liger = false;
  auto a = LowerTraining(Tiny(), Liger(), TestGpu());
  auto b = LowerTraining(Tiny(), hf, TestGpu());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_LT(a->stream.events().size(), b->stream.events().size());
}

TEST(Liger, RefusesFamiliesAndImplsItDoesNotModel) {
  TrainingSetup s = Liger();
  s.loss = LossKind::kChunked;
  EXPECT_FALSE(LowerTraining(Tiny(), s, TestGpu()).ok());
  s = Liger();
  s.impl = ModelImpl::kTorchtune;
  EXPECT_FALSE(LowerTraining(Tiny(), s, TestGpu()).ok());
  s = Liger();
  s.device_rules = DeviceRules::kCpu;
  EXPECT_FALSE(LowerTraining(Tiny(), s, TestGpu()).ok());
}

}  // namespace vramscope::liger_test
