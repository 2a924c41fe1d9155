// Lowering invariants and per-layer byte counts checked against formulas
// written out here, independently of the code under test.
#include "vramscope/lower.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <set>

#include "int_math.h"
#include "t5.h"
#include "test_models.h"

#include "vramscope/saved_activations.h"
#include "vramscope/simulate.h"

namespace vramscope {
namespace {

using lower_testing::TestGpu;
using lower_testing::Tiny;

SimResult RunLowered(const TrainingSetup& setup, const ModelSpec& m) {
  auto lowered = LowerTraining(m, setup, TestGpu());
  EXPECT_TRUE(lowered.ok()) << (lowered.ok() ? "" : lowered.error().message);
  SimOptions o;
  o.alloc.ideal = true;
  auto sim = Simulate(lowered->stream, o);
  EXPECT_TRUE(sim.ok());
  return *sim;
}

// Three steps, each forward / backward / optimizer after setup; steps 2 and 3
// identical (the steady state).
void ExpectSteadyState(const SimResult& r) {
  ASSERT_EQ(r.phases.size(), 10u);
  for (int ph = 0; ph < 3; ++ph) {
    EXPECT_EQ(r.phases[4 + ph].peak_allocated_bytes, r.phases[7 + ph].peak_allocated_bytes)
        << "phase " << ph;
  }
}

TEST(Lower, FlashAttentionInFp32IsRejected) {
  TrainingSetup s;
  s.precision = Precision::kFp32;
  s.attn = Attention::kFlash;
  auto lowered = LowerTraining(Tiny(), s, TestGpu());
  ASSERT_FALSE(lowered.ok());
  EXPECT_NE(lowered.error().message.find("--attn flash"), std::string::npos);
}

TEST(Lower, SteadyStateAndNothingLeaks) {
  const ModelSpec m = Tiny();
  for (Precision p :
       {Precision::kFp32, Precision::kFp16Mixed, Precision::kBf16Mixed, Precision::kBf16}) {
    for (GradCkpt c : {GradCkpt::kNone, GradCkpt::kFull, GradCkpt::kReentrant}) {
      for (Attention a : {Attention::kEager, Attention::kSdpa, Attention::kFlash}) {
        if (p == Precision::kFp32 && a == Attention::kFlash)
          continue;  // rejected: flash-attn 2 is 16-bit only
        TrainingSetup s;
        s.optimizer = OptimizerKind::kAdamW;  // foreach: no device step counters left
        s.batch = 2;
        s.seq = 64;
        s.precision = p;
        s.grad_ckpt = c;
        s.attn = a;
        SimResult r = RunLowered(s, m);
        // Phases: 3 steps x (forward, backward, optimizer) after setup.
        ASSERT_EQ(r.phases.size(), 10u);
        for (int ph = 0; ph < 3; ++ph) {
          // Step 2 and step 3 are identical (steady state).
          EXPECT_EQ(r.phases[4 + ph].peak_allocated_bytes, r.phases[7 + ph].peak_allocated_bytes)
              << "phase " << ph;
        }
        // After the last step only weights and optimizer state remain:
        // params + 2 AdamW moments, all in the parameter dtype.
        // fp16-mixed also keeps GradScaler's fp32 scale and int32 growth tracker.
        const uint64_t pbytes = (p == Precision::kBf16) ? 2 : 4;
        const uint64_t scaler_bytes = (p == Precision::kFp16Mixed) ? 4 + 4 : 0;
        EXPECT_EQ(r.final_stats.allocated_bytes, m.ParameterCount() * pbytes * 3 + scaler_bytes);
      }
    }
  }
}

// --impl torchtune: steady state, nothing left but the weights, the optimizer
// state and the rotary cache buffer (max_position_embeddings x head_dim fp32);
// bf16 full fine-tuning saves each RMSNorm's fp32 x * rstd (the composite path
// for a bf16 scale over an fp32 input), so more than transformers' modules;
// non-Llama models are refused.
TEST(Lower, TorchtuneModulesSteadyStateAndRopeCache) {
  const ModelSpec m = Tiny();
  // The cache [max_seq_len, head_dim / 2, 2] and theta [head_dim / 2], fp32.
  const uint64_t rope_cache_bytes = (m.max_position_embeddings * m.head_dim + m.head_dim / 2) * 4;
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    for (GradCkpt c : {GradCkpt::kNone, GradCkpt::kFull}) {
      TrainingSetup s;
      s.optimizer = OptimizerKind::kAdamW;
      s.batch = 2;
      s.seq = 64;
      s.precision = p;
      s.grad_ckpt = c;
      s.loss = LossKind::kTorchtuneChunked;
      s.impl = ModelImpl::kTorchtune;
      SimResult r = RunLowered(s, m);
      ExpectSteadyState(r);
      const uint64_t pbytes = p == Precision::kBf16 ? 2 : 4;
      EXPECT_EQ(r.final_stats.allocated_bytes, m.ParameterCount() * pbytes * 3 + rope_cache_bytes);
    }
  }
  TrainingSetup s;
  s.precision = Precision::kBf16;
  s.seq = 64;
  s.loss = LossKind::kTorchtuneChunked;
  const uint64_t hf = RunLowered(s, m).final_stats.peak_allocated_bytes;
  s.impl = ModelImpl::kTorchtune;
  EXPECT_GT(RunLowered(s, m).final_stats.peak_allocated_bytes, hf);
  ModelSpec gpt2 = m;
  gpt2.model_type = "gpt2";
  auto refused = LowerTraining(gpt2, s, TestGpu());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("--impl torchtune"), std::string::npos);
}

// --impl litgpt with --loss litgpt-chunked: steady state (the loop's logits
// dropped after the last step), nothing left but the weights, AdamW's two
// states, a separate lm_head where the embeddings are tied, and the fp32 RoPE
// cache (cos and sin, --seq x head_dim each); the fused qkv holds as many
// weights as q / k / v; GPT-2 and LitGPT's quantized LoRA are refused with messages.
TEST(Lower, LitgptModulesSteadyStateAndRopeCache) {
  const ModelSpec m = Tiny();
  const uint64_t head_bytes_elems = m.tie_word_embeddings ? m.vocab_size * m.hidden_size : 0;
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kBf16Mixed}) {
    for (GradCkpt c : {GradCkpt::kNone, GradCkpt::kFull}) {
      TrainingSetup s;
      s.optimizer = OptimizerKind::kAdamW;
      s.batch = 2;
      s.seq = 200;  // two lm_head chunks, the second 72 tokens
      s.precision = p;
      s.grad_ckpt = c;
      s.loss = LossKind::kLitgptChunked;
      s.impl = ModelImpl::kLitgpt;
      SimResult r = RunLowered(s, m);
      ExpectSteadyState(r);
      const uint64_t pbytes = p == Precision::kBf16 ? 2 : 4;
      const uint64_t rope_bytes = 2 * s.seq * m.head_dim * 4;
      EXPECT_EQ(r.final_stats.allocated_bytes,
                (m.ParameterCount() + head_bytes_elems) * pbytes * 3 + rope_bytes);
    }
  }
  TrainingSetup s;
  s.impl = ModelImpl::kLitgpt;
  ModelSpec gpt2 = m;
  gpt2.model_type = "gpt2";
  auto refused = LowerTraining(gpt2, s, TestGpu());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("'gpt2'"), std::string::npos);
  s.finetune = Finetune::kQLora;
  refused = LowerTraining(m, s, TestGpu());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("BitsandbytesPrecision"), std::string::npos);
}

// LitGPT's LoRA (litgpt/lora.py 0.5.13) under --impl litgpt, derived by hand
// from its code: the fused qkv's one adapter pair is lora_A [r * N, h] and
// lora_B [adapted out, r] for its N adapted slices; at the steady state the
// base weights, the adapters with AdamW's two states, the RoPE cache and, when
// a slice has no adapter, each layer's int64 `_lora_ind` buffer (made once, by
// the first forward) remain. Per forward and layer, zero padding makes one
// [tokens, qkv out] `new_zeros`; the grouped conv1d runs once per adapted
// slice (query groups < heads) and their outputs are concatenated.
TEST(Lower, LitgptLoraAdaptersBuffersAndConvolutions) {
  const ModelSpec m = Tiny();
  ASSERT_LT(m.num_kv_heads, m.num_heads);  // the per-slice conv1d path
  const uint64_t r = 4, h = m.hidden_size, L = m.num_layers;
  const uint64_t q_out = m.num_heads * m.head_dim, kv_out = m.num_kv_heads * m.head_dim;
  const uint64_t head_elems = m.tie_word_embeddings ? m.vocab_size * h : 0;
  struct Case {
    std::vector<std::string> targets;
    uint64_t slices, adapted_out;
  };
  for (const Case& c : {Case{{"q", "v"}, 2, q_out + kv_out}, Case{{"k"}, 1, kv_out},
                        Case{{"q", "k", "v"}, 3, q_out + 2 * kv_out}}) {
    TrainingSetup s;
    s.optimizer = OptimizerKind::kAdamW;
    s.batch = 2;
    s.seq = 96;
    s.precision = Precision::kBf16;
    s.finetune = Finetune::kLora;
    s.lora_rank = r;
    s.lora_targets = c.targets;
    s.lora_dtype = LoraDtype::kModel;
    s.loss = LossKind::kLitgptChunked;
    s.impl = ModelImpl::kLitgpt;
    auto lowered = LowerTraining(m, s, TestGpu());
    ASSERT_TRUE(lowered.ok()) << lowered.error().message;
    const uint64_t adapters = L * (r * c.slices * h + c.adapted_out * r);
    EXPECT_EQ(lowered->trainable_parameters, adapters);
    const bool padded = c.slices < 3;
    SimResult sim = RunLowered(s, m);
    ExpectSteadyState(sim);
    const uint64_t rope_bytes = 2 * s.seq * m.head_dim * 4;
    const uint64_t index_bytes = padded ? L * c.adapted_out * 8 : 0;
    EXPECT_EQ(sim.final_stats.allocated_bytes,
              (m.ParameterCount() + head_elems) * 2 + adapters * 2 * 3 + rope_bytes + index_bytes);
    std::map<std::string, uint64_t> count;
    const EventStream& es = lowered->stream;
    for (const Event& e : es.events()) {
      if (e.kind == EventKind::kAlloc) ++count[std::string(es.String(e.op))];
    }
    const uint64_t forwards = 3;  // three steps, no checkpointing
    EXPECT_EQ(count["litgpt::lora_ind"], padded ? L : 0);
    EXPECT_EQ(count["aten::new_zeros"], padded ? L * forwards : 0);
    EXPECT_EQ(count["aten::convolution"], L * forwards * c.slices);
  }
}

// Activations at the end of forward for bf16 weights, flash attention, full
// fine-tune (reference: per token per layer 20h + 4kd + 8i + 4a when a*d = h;
// two RMSNorms at 6h, the q/k/v input 2h, the gate/up input 2h, q 2h, out 2h,
// k and v 2kd each, the lse 4a, and 4 x 2i in the MLP). RoPE outputs replace q
// and k, so q/k saved are the post-RoPE copies.
TEST(Lower, ActivationsPerLayerMatchTheFormula) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.batch = 1;
  s.seq = 128;
  s.precision = Precision::kBf16;
  s.attn = Attention::kFlash;
  s.optimizer = OptimizerKind::kNone;
  s.steps = 1;
  SimResult r = RunLowered(s, m);
  const uint64_t h = 256, i = 688, a = 8, k = 2, d = 32, t = 128, L = 4;
  const uint64_t per_token_layer = 20 * h + 4 * k * d + 8 * i + 4 * a;
  // End of forward: weights + every layer's saved tensors + the final norm's
  // saved fp32 input (4h) and rsqrt (4/token), bf16 normed (2h), the lm_head
  // input is that norm output (counted), log-softmax fp32 (4V) + loss, ids.
  const uint64_t V = 1000;
  const uint64_t expected = m.ParameterCount() * 2 + L * t * per_token_layer +
                            L * t * 4 * 2 /* rsqrt x2 */ + t * (4 * h + 4 + 2 * h + 2 * h) +
                            t * 4 * V + 512 /* loss */;
  // The forward phase ends with those alive (ids/labels freed by then, cos/sin freed).
  const uint64_t end_fwd = r.phases[1].allocated_at_end_bytes;
  EXPECT_NEAR(static_cast<double>(end_fwd), static_cast<double>(expected), expected * 0.01);
}

TEST(Lower, GradientCheckpointingKeepsOnlyLayerInputs) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.batch = 1;
  s.seq = 256;
  s.precision = Precision::kBf16;
  s.attn = Attention::kFlash;
  s.optimizer = OptimizerKind::kNone;
  s.steps = 1;
  SimResult plain = RunLowered(s, m);
  s.grad_ckpt = GradCkpt::kFull;
  SimResult ckpt = RunLowered(s, m);
  EXPECT_LT(ckpt.phases[1].allocated_at_end_bytes, plain.phases[1].allocated_at_end_bytes);
  // What stays per layer is its bf16 input: 2 * h bytes per token.
  const uint64_t params = m.ParameterCount() * 2;
  const uint64_t kept = ckpt.phases[1].allocated_at_end_bytes - params;
  const uint64_t layer_inputs = 4 * 256 * 256 * 2;
  EXPECT_GE(kept, layer_inputs);
}

TEST(Lower, BadKnobsAreOneLineErrors) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.seq = 0;
  auto r = LowerTraining(m, s, TestGpu());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.find('\n'), std::string::npos);
  s = TrainingSetup{};
  s.finetune = Finetune::kLora;
  s.lora_rank = 100000;
  EXPECT_FALSE(LowerTraining(m, s, TestGpu()).ok());
  s = TrainingSetup{};
  s.finetune = Finetune::kLora;
  s.lora_dropout = 1.5;
  EXPECT_FALSE(LowerTraining(m, s, TestGpu()).ok());
}

// The knob parsers quote what they reject with common::QuoteForMessage:
// plain text as before, control characters and non-ASCII bytes escaped.
TEST(Lower, KnobParsersQuoteRejectedText) {
  EXPECT_EQ(ParsePrecision("bf17").error().message,
            "--precision: 'bf17' is not one of fp32, fp16-mixed, bf16-mixed, fp16, bf16");
  EXPECT_EQ(ParseZeroStage("4").error().message, "--zero: '4' is not one of 1, 2, 3");
  EXPECT_EQ(ParseLoraTargets("q,x").error().message,
            "--lora-targets: 'x' is not one of q, k, v, o, gate, up, down, lm_head, all-linear");
  EXPECT_EQ(ParseFsdpSharding("f\x1b[2J\n").error().message,
            "--fsdp: 'f\\x1b[2J\\x0a' is not one of full, grad-op, hybrid");
  EXPECT_EQ(ParseOffload("caf\xC3\xA9").error().message,
            "--offload: 'caf\\xc3\\xa9' is not one of none, optimizer, params");
  EXPECT_LT(ParseAttention(std::string(100000, 'x')).error().message.size(), 200u);
}

// ParseVersion (common::ParseMajorMinor): MAJOR.MINOR, then nothing or
// ".anything"; MAJOR from 1, both at most 99.
TEST(Lower, ParseVersionAcceptsWhatItAcceptedBefore) {
  EXPECT_EQ(*ParseVersion("4.46", "--transformers-version"), 446);
  EXPECT_EQ(*ParseVersion("4.46.1", "--transformers-version"), 446);
  EXPECT_EQ(*ParseVersion("2.11.0+cu128", "--torch-version"), 211);
  EXPECT_EQ(*ParseVersion("5.0", "--transformers-version"), 500);
  EXPECT_EQ(*ParseVersion("04.05", "--transformers-version"), 405);
  EXPECT_EQ(*ParseVersion("99.99", "--transformers-version"), 9999);
  for (const char* bad : {"", "4", "4.", ".46", "0.9", "4.46rc1", "100.1", "4.100", "-4.46",
                          "+4.46", " 4.46", "4.-0", "99999999999999999999.1"}) {
    EXPECT_FALSE(ParseVersion(bad, "--torch-version").ok()) << bad;
  }
  EXPECT_EQ(ParseVersion("4.x", "--transformers-version").error().message,
            "--transformers-version: '4.x' is not a version like 4.46");
  EXPECT_EQ(ParseVersion("4\x1b.46", "--torch-version").error().message,
            "--torch-version: '4\\x1b.46' is not a version like 4.46");
}

TEST(Lower, CeilDivDoesNotWrap) {
  constexpr uint64_t kMax = ~uint64_t{0};
  EXPECT_EQ(lower::CeilDiv(0, 7), 0u);
  EXPECT_EQ(lower::CeilDiv(7, 7), 1u);
  EXPECT_EQ(lower::CeilDiv(8, 7), 2u);
  EXPECT_EQ(lower::CeilDiv(kMax, 1), kMax);
  EXPECT_EQ(lower::CeilDiv(kMax, 2), uint64_t{1} << 63);  // (a + b - 1) / b gave 0
  EXPECT_EQ(lower::CeilDiv(kMax - 1, kMax), 1u);
}

TEST(Lower, LoraTrainsOnlyAdapters) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.finetune = Finetune::kLora;
  s.lora_rank = 8;
  s.precision = Precision::kBf16;
  s.optimizer = OptimizerKind::kAdamW;
  s.seq = 64;
  auto lowered = LowerTraining(m, s, TestGpu());
  ASSERT_TRUE(lowered.ok()) << lowered.error().message;
  // q: 256 -> 256, v: 256 -> 64; r * (in + out) each, 4 layers.
  EXPECT_EQ(lowered->trainable_parameters, 4u * 8u * ((256 + 256) + (256 + 64)));
  SimOptions o;
  o.alloc.ideal = true;
  auto sim = Simulate(lowered->stream, o);
  ASSERT_TRUE(sim.ok());
  // End: base bf16 + adapters fp32 + 2 fp32 moments per adapter param.
  EXPECT_EQ(sim->final_stats.allocated_bytes,
            m.ParameterCount() * 2 + lowered->trainable_parameters * 4 * 3);
}

// --lora-dtype model (torchtune, LitGPT): adapters in the model's bf16, so the
// end state holds 2-byte adapters and 2-byte moments, and no adapted layer
// copies its input to fp32 (fewer temporaries than PEFT's fp32 adapters).
TEST(Lower, LoraInTheModelsDtypeHasNoFp32Copies) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.finetune = Finetune::kLora;
  s.lora_rank = 8;
  s.precision = Precision::kBf16;
  s.optimizer = OptimizerKind::kAdamW;
  s.seq = 64;
  s.lora_dropout = 0;
  auto peft = LowerTraining(m, s, TestGpu());
  s.lora_dtype = LoraDtype::kModel;
  auto model_dtype = LowerTraining(m, s, TestGpu());
  ASSERT_TRUE(peft.ok() && model_dtype.ok());
  EXPECT_EQ(model_dtype->trainable_parameters, peft->trainable_parameters);
  SimOptions o;
  o.alloc.ideal = true;
  auto a = Simulate(peft->stream, o), b = Simulate(model_dtype->stream, o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->final_stats.allocated_bytes,
            m.ParameterCount() * 2 + model_dtype->trainable_parameters * 2 * 3);
  // The fp32 input copies PEFT's adapters make are gone: a lower peak.
  EXPECT_LT(b->final_stats.peak_allocated_bytes, a->final_stats.peak_allocated_bytes);
}

// cuBLAS gives each thread's handle its workspace at that handle's first gemm,
// after the gemm's output (CublasHandlePool.cpp): the forward's at the first
// linear, the backward's (the autograd thread) at lm_head's MmBackward0, which
// makes the weight's gradient before the input's (mm: mat2 before self).
TEST(Lower, CublasWorkspacesComeWithEachThreadsFirstGemm) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.precision = Precision::kFp32;
  s.optimizer = OptimizerKind::kSgd;
  s.seq = 48;
  s.steps = 2;
  GpuSpec gpu = TestGpu();
  gpu.cublas_workspace_bytes = 32 << 20;
  auto lowered = LowerTraining(m, s, gpu);
  ASSERT_TRUE(lowered.ok()) << lowered.error().message;
  const EventStream& es = lowered->stream;
  std::vector<std::pair<Phase, std::string>> before_workspace;  // the alloc just before each
  std::vector<uint64_t> first_backward_mm;                      // sizes, in order
  Phase phase = Phase::kSetup;
  std::string last_op;
  for (const Event& e : es.events()) {
    if (e.kind == EventKind::kPhase) phase = e.phase;
    if (e.kind != EventKind::kAlloc) continue;
    const std::string op(es.String(e.op));
    if (op == "cublas_workspace") before_workspace.emplace_back(phase, last_op);
    if (op == "MmBackward0" && phase == Phase::kBackward && first_backward_mm.size() < 2) {
      first_backward_mm.push_back(e.size_bytes);
    }
    last_op = op;
  }
  ASSERT_EQ(before_workspace.size(), 2u);  // one per thread, for the whole run
  EXPECT_EQ(before_workspace[0], std::make_pair(Phase::kForward, std::string("aten::mm")));
  EXPECT_EQ(before_workspace[1], std::make_pair(Phase::kBackward, std::string("MmBackward0")));
  // lm_head [1000 x 256] fp32: its weight gradient, then the input's [48 x 256].
  EXPECT_EQ(first_backward_mm, (std::vector<uint64_t>{1000 * 256 * 4, 48 * 256 * 4}));
}

TEST(Lower, QloraStoresNf4AndDequantizesPerMatmul) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.finetune = Finetune::kQLora;
  s.precision = Precision::kBf16;
  s.optimizer = OptimizerKind::kNone;
  s.seq = 48;  // 48 x 256 x 2-byte gradients differ in size from every weight
  s.steps = 1;
  auto lowered = LowerTraining(m, s, TestGpu());
  ASSERT_TRUE(lowered.ok()) << lowered.error().message;
  // Quantized: every decoder linear (q 256x256, k/v 64x256, o 256x256,
  // gate/up/down 688x256 each) per layer; lm_head stays unquantized.
  const uint64_t linear_numels[] = {256 * 256, 64 * 256,  64 * 256, 256 * 256,
                                    688 * 256, 688 * 256, 688 * 256};
  // NF4 with double quantization (QLoRA paper, section 3): 4 bits per
  // weight, an 8-bit absmax per 64-block, an fp32 absmax per 256 blocks.
  // Beside it, each weight's QuantState keeps an NF4 code table (16 fp32), an
  // fp32 offset and its own copy of the 256-entry fp32 dynamic code
  // (bitsandbytes 0.50.2 functional.py quantize_4bit / quantize_blockwise).
  auto nf4 = [](uint64_t n) {
    return n / 2 + (n + 63) / 64 + ((n + 63) / 64 + 255) / 256 * 4 + 16 * 4 + 4 + 256 * 4;
  };
  uint64_t quantized_bytes = 0, quantized_numel = 0;
  for (uint64_t n : linear_numels) {
    quantized_bytes += 4 * nf4(n);
    quantized_numel += 4 * n;
  }
  // Everything else is cast to fp32 by peft's prepare_model_for_kbit_training.
  const uint64_t other_bytes = (m.ParameterCount() - quantized_numel) * 4;
  const uint64_t adapters_bytes = lowered->trainable_parameters * 4;
  uint64_t setup_bytes = 0;
  std::vector<uint64_t> dequant_sizes, backward_dequant_sizes;
  const EventStream& es = lowered->stream;
  Phase phase = Phase::kSetup;
  for (const Event& e : es.events()) {
    if (e.kind == EventKind::kPhase) phase = e.phase;
    if (e.kind != EventKind::kAlloc) continue;
    if (phase == Phase::kSetup) setup_bytes += e.size_bytes;
    if (es.String(e.op) == "bnb::dequantize_4bit") dequant_sizes.push_back(e.size_bytes);
    const bool weight_sized = e.size_bytes == 2 * 256 * 256 || e.size_bytes == 2 * 64 * 256 ||
                              e.size_bytes == 2 * 688 * 256;
    if (es.String(e.op) == "MatMul4BitBackward" && weight_sized && phase == Phase::kBackward) {
      backward_dequant_sizes.push_back(e.size_bytes);
    }
  }
  EXPECT_EQ(setup_bytes, quantized_bytes + other_bytes + adapters_bytes);
  // One bf16 dequantized copy per quantized linear in forward and again in backward.
  ASSERT_EQ(dequant_sizes.size(), 4u * 7u);
  uint64_t dequant_total = 0;
  for (uint64_t b : dequant_sizes) dequant_total += b;
  EXPECT_EQ(dequant_total, quantized_numel * 2);
  uint64_t backward_total = 0;
  for (uint64_t b : backward_dequant_sizes) backward_total += b;
  // ... except layer 0's q, k and v: their input (norm of the frozen
  // embedding) does not require grad, so MatMul4Bit computes no grad_A there.
  EXPECT_EQ(backward_dequant_sizes.size(), 4u * 7u - 3u);
  EXPECT_EQ(backward_total, (quantized_numel - (256 * 256 + 2 * 64 * 256)) * 2);
}

// A small BertForMaskedLM config.
constexpr const char* kTinyBert = R"({
  "model_type": "bert", "architectures": ["BertForMaskedLM"],
  "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2,
  "num_attention_heads": 4, "vocab_size": 3000, "max_position_embeddings": 512,
  "type_vocab_size": 2, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1
})";

TEST(Lower, BertMaskedLmSteadyStateAndHead) {
  auto m = ParseModelConfig(kTinyBert, "tiny-bert");
  ASSERT_TRUE(m.ok()) << m.error().message;
  for (Attention a : {Attention::kEager, Attention::kSdpa}) {
    for (GradCkpt c : {GradCkpt::kNone, GradCkpt::kFull}) {
      TrainingSetup s;
      s.precision = Precision::kBf16Mixed;  // fp32 weights under bf16 autocast
      s.optimizer = OptimizerKind::kAdamW;
      s.batch = 2;
      s.seq = 64;
      s.attn = a;
      s.grad_ckpt = c;
      auto lowered = LowerTraining(*m, s, TestGpu());
      ASSERT_TRUE(lowered.ok()) << lowered.error().message;
      SimResult r = RunLowered(s, *m);
      ASSERT_EQ(r.phases.size(), 10u);
      for (int ph = 0; ph < 3; ++ph) {
        EXPECT_EQ(r.phases[4 + ph].peak_allocated_bytes, r.phases[7 + ph].peak_allocated_bytes);
      }
      // fp32 weights + two AdamW moments remain, and BertEmbeddings' two int64
      // buffers (position_ids, token_type_ids: [1, max_position_embeddings]).
      EXPECT_EQ(r.final_stats.allocated_bytes,
                m->ParameterCount() * 4 * 3 + 2 * m->max_position_embeddings * 8);
      // The MLM head's log_softmax output is saved: [tokens, vocab] in bf16
      // under CUDA bf16 autocast (cross_entropy passes the scores' dtype),
      // then nll_loss's fp32 copy of it (fp32 autocast list), saved too.
      bool found = false, copied = false;
      const EventStream& es = lowered->stream;
      for (const Event& e : es.events()) {
        if (e.kind != EventKind::kAlloc) continue;
        if (es.String(e.op) == "aten::_log_softmax") {
          EXPECT_EQ(e.size_bytes, 2u * 64u * 3000u * 2u);
          found = true;
        }
        if (es.String(e.op) == "aten::_to_copy" && e.size_bytes == 2u * 64u * 3000u * 4u) {
          copied = true;
        }
      }
      EXPECT_TRUE(found);
      EXPECT_TRUE(copied);
    }
  }
  TrainingSetup s;
  s.loss = LossKind::kChunked;
  EXPECT_FALSE(LowerTraining(*m, s, TestGpu()).ok());
}

// TRL 1.16's fused LM head (trl/kernels/chunked_logprob.py), CUDA rules: no
// [tokens, vocab] tensor ever exists; the tile buffer is [min(N, 4096), 32768]
// in the compute dtype whatever the vocabulary; with bf16 weights backward
// accumulates the head's gradient in an fp32 [vocab, hidden] buffer first.
TEST(Lower, TrlFusedHeadTilesInsteadOfLogits) {
  // Tiny with a Llama-3-sized vocabulary: 4 tiles of 32768 per token chunk.
  std::string config = lower_testing::kTinyLlama;
  const std::string small = "\"vocab_size\": 1000";
  config.replace(config.find(small), small.size(), "\"vocab_size\": 128256");
  auto parsed = ParseModelConfig(config, "tiny-big-vocab");
  ASSERT_TRUE(parsed.ok());
  const ModelSpec m = *parsed;
  TrainingSetup s;
  s.batch = 2;
  s.seq = 2048;
  s.precision = Precision::kBf16;
  s.loss = LossKind::kTrlFused;
  auto lowered = LowerTraining(m, s, TestGpu());
  ASSERT_TRUE(lowered.ok()) << lowered.error().message;
  const uint64_t positions = 2 * 2047, logits_bytes = 2 * 2048 * m.vocab_size * 2;
  const uint64_t head_fp32 = m.vocab_size * m.hidden_size * 4;
  bool tile_buffer = false, head_accumulator = false;
  const EventStream& es = lowered->stream;
  for (const Event& e : es.events()) {
    if (e.kind != EventKind::kAlloc) continue;
    if (es.String(e.module) == "lm_head") EXPECT_LT(e.size_bytes, logits_bytes) << es.String(e.op);
    if (es.String(e.op) == "aten::empty" && e.size_bytes == positions * 32768 * 2)
      tile_buffer = true;
    if (e.size_bytes == head_fp32) head_accumulator = true;
  }
  EXPECT_TRUE(tile_buffer);
  EXPECT_TRUE(head_accumulator);
  // Steady state, nothing left but weights and AdamW's moments.
  SimResult r = RunLowered(s, m);
  ExpectSteadyState(r);
  EXPECT_EQ(r.final_stats.allocated_bytes, m.ParameterCount() * 2 * 3);
  // Below transformers' loss, which materializes the logits and their fp32 copy.
  TrainingSetup hf = s;
  hf.loss = LossKind::kHf;
  EXPECT_LT(RunLowered(s, m).peak_allocated_bytes, RunLowered(hf, m).peak_allocated_bytes);
  // What the fused head does not model: LoRA on lm_head, sharded heads.
  s.finetune = Finetune::kLora;
  s.lora_targets = {"q", "lm_head"};
  EXPECT_FALSE(LowerTraining(m, s, TestGpu()).ok());
  s.finetune = Finetune::kFull;
  s.parallel.gpus = 2;
  s.parallel.dp_mode = DataParallel::kFsdp;
  EXPECT_FALSE(LowerTraining(m, s, TestGpu()).ok());
}

// TRL's DPO step (trl 1.16.0 DPOTrainer): chosen and rejected rows run
// together; full fine-tuning keeps a frozen reference copy of every weight,
// PEFT disables its adapters instead, and precomputed reference
// log-probabilities drop both the copy and the reference forward.
TEST(Lower, DpoReferenceCopyAndForward) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.batch = 2;
  s.seq = 64;
  s.precision = Precision::kBf16;
  s.loss = LossKind::kTrlFused;
  s.dpo = true;
  const uint64_t weights = m.ParameterCount() * 2;
  SimResult full = RunLowered(s, m);
  ExpectSteadyState(full);
  // Weights, two AdamW moments and the reference copy remain.
  EXPECT_EQ(full.final_stats.allocated_bytes, weights * 3 + weights);
  TrainingSetup pre = s;
  pre.dpo_precompute_ref = true;
  SimResult precomputed = RunLowered(pre, m);
  EXPECT_EQ(precomputed.final_stats.allocated_bytes, weights * 3);
  // The reference forward runs while the policy's activations are alive.
  EXPECT_GT(full.phases[4].peak_allocated_bytes - weights,
            precomputed.phases[4].peak_allocated_bytes);
  // Under LoRA the reference is the same weights with the adapters off.
  TrainingSetup lora = s;
  lora.finetune = Finetune::kLora;
  TrainingSetup lora_pre = lora;
  lora_pre.dpo_precompute_ref = true;
  SimResult with_ref = RunLowered(lora, m), without = RunLowered(lora_pre, m);
  EXPECT_EQ(with_ref.final_stats.allocated_bytes, without.final_stats.allocated_bytes);
  EXPECT_GE(with_ref.phases[4].peak_allocated_bytes, without.phases[4].peak_allocated_bytes);
  // DPO is modelled through TRL's fused head only.
  s.loss = LossKind::kHf;
  EXPECT_FALSE(LowerTraining(m, s, TestGpu()).ok());
}

// Padding-free packing: one row of batch x seq tokens. SDPA (transformers 5.x)
// gets a [T, T] bool block mask, built through three more [T, T] bool
// temporaries; flash-attn reads position_ids and gets none.
TEST(Lower, PackingRunsOneRowWithABlockMask) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.batch = 4;
  s.seq = 256;
  s.precision = Precision::kBf16;
  s.packed = true;
  s.use_cache = false;  // with a DynamicCache transformers skips the packed-sequence search
  const uint64_t t = 4 * 256;
  auto count = [&](const TrainingSetup& setup, uint64_t bytes) {
    auto lowered = LowerTraining(m, setup, TestGpu());
    EXPECT_TRUE(lowered.ok()) << (lowered.ok() ? "" : lowered.error().message);
    int n = 0;
    const EventStream& es = lowered->stream;
    for (const Event& e : es.events()) {
      const std::string_view op = es.String(e.op);
      const bool mask_op =
          op == "aten::le" || op == "aten::bitwise_and" || op == "aten::eq" || op == "causal_mask";
      if (e.kind == EventKind::kAlloc && e.size_bytes == bytes && mask_op) ++n;
    }
    return n;
  };
  // Per forward (3 steps): the mask and its three temporaries.
  EXPECT_EQ(count(s, t * t), 3 * 4);
  TrainingSetup unpacked = s;
  unpacked.packed = false;
  EXPECT_EQ(count(unpacked, t * t), 0);
  TrainingSetup flash = s;
  flash.attn = Attention::kFlash;
  EXPECT_EQ(count(flash, t * t), 0);
  // transformers before 4.54 did not look for packed sequences.
  TrainingSetup old = s;
  old.transformers_version = 453;
  EXPECT_EQ(count(old, t * t), 0);
  TrainingSetup cached = s;
  cached.use_cache = true;
  EXPECT_EQ(count(cached, t * t), 0);
  s.dpo = true;
  s.loss = LossKind::kTrlFused;
  EXPECT_FALSE(LowerTraining(m, s, TestGpu()).ok());
}

// ViTForImageClassification: steady state, nothing left but the weights and
// AdamW's moments after the last step (the batch goes with its step), and the
// setups it refuses.
TEST(VitLower, SteadyStateAndRefusals) {
  auto parsed = ParseModelConfig(R"({"model_type": "vit", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
      "image_size": 32, "patch_size": 8, "num_labels": 10})",
                                 "tiny-vit");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  const ModelSpec m = *parsed;
  EXPECT_TRUE(m.is_vit);
  for (Attention a : {Attention::kEager, Attention::kSdpa}) {
    for (GradCkpt c : {GradCkpt::kNone, GradCkpt::kFull, GradCkpt::kReentrant}) {
      TrainingSetup s;
      s.batch = 4;
      s.precision = Precision::kBf16;
      s.attn = a;
      s.grad_ckpt = c;
      SimResult r = RunLowered(s, m);
      ExpectSteadyState(r);
      EXPECT_EQ(r.final_stats.allocated_bytes, m.ParameterCount() * 2 * 3);
    }
  }
  TrainingSetup s;
  for (auto change : std::vector<std::function<void(TrainingSetup*)>>{
           [](TrainingSetup* t) { t->attn = Attention::kFlash; },
           [](TrainingSetup* t) { t->image_size = 64; },
           [](TrainingSetup* t) { t->finetune = Finetune::kQLora; },
           [](TrainingSetup* t) { t->loss = LossKind::kChunked; },
           [](TrainingSetup* t) { t->parallel.gpus = 2; }}) {
    TrainingSetup bad = s;
    change(&bad);
    EXPECT_FALSE(LowerTraining(m, bad, TestGpu()).ok());
  }
}

// CLIPModel's contrastive step: steady state for every attention x
// checkpointing x precision, nothing left but the weights and AdamW's moments
// (the batch goes with its step), and what it refuses.
TEST(ClipLower, SteadyStateAndRefusals) {
  auto parsed = ParseModelConfig(R"({"model_type": "clip", "projection_dim": 48,
      "text_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 32},
      "vision_config": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "intermediate_size": 64, "image_size": 32, "patch_size": 8}})",
                                 "tiny-clip");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  const ModelSpec m = *parsed;
  ASSERT_TRUE(m.is_clip);
  for (int version : {457, 524}) {
    for (Attention a : {Attention::kEager, Attention::kSdpa}) {
      for (GradCkpt c : {GradCkpt::kNone, GradCkpt::kFull, GradCkpt::kReentrant}) {
        SCOPED_TRACE(testing::Message()
                     << version << " " << AttentionName(a) << " " << GradCkptName(c));
        TrainingSetup s;
        s.batch = 4;
        s.precision = Precision::kBf16;
        s.attn = a;
        s.grad_ckpt = c;
        s.transformers_version = version;
        SimResult r = RunLowered(s, m);
        ExpectSteadyState(r);
        // And the two int64 position_ids buffers (32 text and 17 vision positions).
        EXPECT_EQ(r.final_stats.allocated_bytes, m.ParameterCount() * 2 * 3 + (32 + 17) * 8);
      }
    }
  }
  TrainingSetup lora;
  lora.finetune = Finetune::kLora;
  lora.lora_targets = {"q", "k", "v", "o"};
  lora.grad_ckpt = GradCkpt::kFull;
  lora.precision = Precision::kBf16Mixed;
  ExpectSteadyState(RunLowered(lora, m));
  TrainingSetup s;
  for (auto change : std::vector<std::function<void(TrainingSetup*)>>{
           [](TrainingSetup* t) { t->attn = Attention::kFlash; },
           [](TrainingSetup* t) { t->image_size = 64; }, [](TrainingSetup* t) { t->text_len = 33; },
           [](TrainingSetup* t) { t->finetune = Finetune::kQLora; },
           [](TrainingSetup* t) { t->loss = LossKind::kChunked; },
           [](TrainingSetup* t) { t->parallel.gpus = 2; },
           [](TrainingSetup* t) {
             t->finetune = Finetune::kLora;
             t->grad_ckpt = GradCkpt::kFull;
             t->transformers_version = 457;
           }}) {
    TrainingSetup bad = s;
    change(&bad);
    EXPECT_FALSE(LowerTraining(m, bad, TestGpu()).ok());
  }
  // A tower alone has no loss to train on.
  auto text = ParseModelConfig(R"({"model_type": "clip_text_model"})", "text.json");
  ASSERT_TRUE(text.ok());
  auto refused = LowerTraining(*text, s, TestGpu());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("--text-encoder"), std::string::npos);
}

// A gated-gelu T5EncoderModel 64 wide with 4 heads of `d_kv`.
ModelSpec TinyT5Encoder(uint64_t d_kv, uint64_t layers) {
  auto parsed = ParseModelConfig(
      fmt::format(R"({{"model_type": "t5", "architectures": ["T5EncoderModel"], "d_model": 64,
          "d_kv": {}, "d_ff": 128, "num_layers": {}, "num_heads": 4, "vocab_size": 256,
          "feed_forward_proj": "gated-gelu"}})",
                  d_kv, layers),
      "tiny-t5-encoder");
  EXPECT_TRUE(parsed.ok()) << parsed.error().message;
  return *parsed;
}

// The model's parameters on the tape as frozen half-precision leaves.
void PlaceFrozenHalfParams(lower::Tape& tape, const ModelSpec& m) {
  for (const ParamTensor& pt : m.params) {
    lower::Param p;
    p.name = pt.name;
    p.numel = pt.numel;
    p.elem_bytes = lower::kHalf;
    p.storage_bytes = pt.numel * lower::kHalf;
    p.trainable = false;
    p.var = tape.New(pt.numel, lower::kHalf, Category::kParameters, "param");
    tape.params.push_back(p);
  }
}

// --text-encoder: the frozen encoders' weights in weight_dtype for the whole
// run, their forward each micro-batch before the UNet's (it adds no more than
// its activations), nothing left behind; other families and denoisers refused.
TEST(FrozenEncoderLower, WeightsForwardAndRefusals) {
  auto unet = LoadCatalogModel("sd-1.5-unet");
  auto clip_l = LoadCatalogModel("sd-1.5-text-encoder");
  ASSERT_TRUE(unet.ok() && clip_l.ok());
  TrainingSetup s;
  s.batch = 2;
  s.image_size = 128;
  s.precision = Precision::kBf16Mixed;
  SimResult without = RunLowered(s, *unet);
  s.text_encoder_names = {"sd-1.5-text-encoder"};
  s.text_encoders = {std::make_shared<const ModelSpec>(*clip_l)};
  SimResult with = RunLowered(s, *unet);
  ExpectSteadyState(with);
  const uint64_t weights = clip_l->ParameterCount() * 2;
  EXPECT_GE(with.final_stats.allocated_bytes, without.final_stats.allocated_bytes + weights);
  EXPECT_LE(with.final_stats.allocated_bytes,
            without.final_stats.allocated_bytes + weights + 2 * 1024 * 1024);
  // fp32: the encoder in fp32 too.
  s.precision = Precision::kFp32;
  TrainingSetup fp32_without = s;
  fp32_without.text_encoders.clear();
  fp32_without.text_encoder_names.clear();
  EXPECT_GE(RunLowered(s, *unet).final_stats.allocated_bytes,
            RunLowered(fp32_without, *unet).final_stats.allocated_bytes + weights * 2);
  // Refusals: a non-CLIP encoder, a non-diffusion model, a prompt past 77 tokens.
  TrainingSetup bad = s;
  bad.text_encoders = {std::make_shared<const ModelSpec>(*unet)};
  auto wrong_family = LowerTraining(*unet, bad, TestGpu());
  ASSERT_FALSE(wrong_family.ok());
  EXPECT_NE(wrong_family.error().message.find("--text-encoder"), std::string::npos);
  EXPECT_FALSE(LowerTraining(Tiny(), s, TestGpu()).ok());
  bad = s;
  bad.text_len = 78;
  EXPECT_FALSE(LowerTraining(*unet, bad, TestGpu()).ok());
}

// FLUX with its CLIP-L and T5-XXL text encoders (the FLUX dreambooth scripts
// with per-image captions): the weights of both in bf16 for the whole run,
// the encoders' states taking the batch's place (the run ends with the same
// allocations as without, plus the weights), a steady state, and the
// refusals: T5 beside a UNet, in fp16, or of the wrong width.
TEST(FrozenEncoderLower, FluxTakesClipAndT5States) {
  auto flux = LoadCatalogModel("flux.1-dev-transformer");
  auto clip_l = LoadCatalogModel("sd-1.5-text-encoder");
  auto t5 = LoadCatalogModel("t5-v1_1-xxl-encoder");
  ASSERT_TRUE(flux.ok() && clip_l.ok() && t5.ok());
  TrainingSetup s;
  s.batch = 1;
  s.image_size = 256;
  s.text_len = 64;
  s.precision = Precision::kBf16;
  s.finetune = Finetune::kLora;
  s.lora_targets = {"q", "k", "v", "o"};
  s.grad_ckpt = GradCkpt::kFull;
  SimResult without = RunLowered(s, *flux);
  s.text_encoder_names = {"sd-1.5-text-encoder", "t5-v1_1-xxl-encoder"};
  s.text_encoders = {std::make_shared<const ModelSpec>(*clip_l),
                     std::make_shared<const ModelSpec>(*t5)};
  SimResult with = RunLowered(s, *flux);
  ExpectSteadyState(with);
  // CLIP's weights and its position_ids buffer (77 int64); T5 has no buffer.
  const uint64_t weights = (clip_l->ParameterCount() + t5->ParameterCount()) * 2 + 77 * 8;
  EXPECT_EQ(with.final_stats.allocated_bytes, without.final_stats.allocated_bytes + weights);
  EXPECT_GE(with.peak_allocated_bytes, without.peak_allocated_bytes + weights);
  // Refusals.
  auto unet = LoadCatalogModel("sd-1.5-unet");
  ASSERT_TRUE(unet.ok());
  TrainingSetup bad = s;
  auto beside_unet = LowerTraining(*unet, bad, TestGpu());
  ASSERT_FALSE(beside_unet.ok());
  EXPECT_NE(beside_unet.error().message.find("T5"), std::string::npos);
  bad.precision = Precision::kFp16;
  EXPECT_FALSE(LowerTraining(*flux, bad, TestGpu()).ok());
  bad = s;
  bad.text_encoders = {std::make_shared<const ModelSpec>(TinyT5Encoder(8, 2))};
  auto narrow = LowerTraining(*flux, bad, TestGpu());
  ASSERT_FALSE(narrow.ok());
  EXPECT_NE(narrow.error().message.find("joint_attention_dim"), std::string::npos);
  auto clip_g = LoadCatalogModel("sdxl-text-encoder-2");
  ASSERT_TRUE(clip_g.ok());
  bad.text_encoders = {std::make_shared<const ModelSpec>(*clip_g)};
  EXPECT_FALSE(LowerTraining(*flux, bad, TestGpu()).ok());
}

// Regression check of the rule in t5.cc (evidence: docs/fidelity.md's
// flux_dev_te points): T5EncoderModel's no-grad forward under SDPA makes one
// [1, heads, T, T] copy of the position bias per layer (create_position_bias_mask's
// .contiguous()) and no [b, heads, T, T] scores, so its peak is below eager's.
TEST(T5Lower, EncoderNoGradSdpaCopiesTheBiasPerLayer) {
  using namespace lower;  // NOLINT: the lowering's internals (t5.h, tape.h)
  const ModelSpec m = TinyT5Encoder(16, 3);
  auto peak_and_copies = [&](Attention attn) {
    EventStream stream;
    Tape tape(&stream);
    PlaceFrozenHalfParams(tape, m);
    auto tp = IndexT5Params(m, tape.params);
    EXPECT_TRUE(tp.ok());
    TrainingSetup s;
    s.attn = attn;
    Var out = T5EncoderNoGrad(tape, m, *tp, s, 16, 128);
    tape.Drop(out);
    uint64_t copies = 0;
    for (const Event& e : stream.events()) {
      if (e.kind == EventKind::kAlloc && stream.String(e.op) == "aten::clone" &&
          e.size_bytes == 4u * 128 * 128 * kHalf)
        ++copies;
    }
    SimOptions o;
    o.alloc.ideal = true;
    auto sim = Simulate(stream, o);
    EXPECT_TRUE(sim.ok());
    return std::pair<uint64_t, uint64_t>{sim->peak_allocated_bytes, copies};
  };
  const auto [sdpa_peak, sdpa_copies] = peak_and_copies(Attention::kSdpa);
  const auto [eager_peak, eager_copies] = peak_and_copies(Attention::kEager);
  EXPECT_EQ(sdpa_copies, 3u);
  EXPECT_EQ(eager_copies, 0u);
  // Eager's peak holds at least one more [16, 4, 128, 128] score tensor.
  EXPECT_LE(sdpa_peak + 16u * 4 * 128 * 128 * kHalf, eager_peak);
}

// torchtune's CEWithChunkedOutputLoss keeps every chunk's logits until the loss
// returns; the loop of --loss chunked drops each after its cross-entropy. The
// forward peaks differ by the other seven chunks' half logits at least.
TEST(Lower, TorchtuneChunkedLossKeepsEveryChunksLogits) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.batch = 2;
  s.seq = 512;
  s.precision = Precision::kBf16;
  s.loss = LossKind::kChunked;
  const uint64_t forward_loop = RunLowered(s, m).phases[4].peak_allocated_bytes;
  s.loss = LossKind::kTorchtuneChunked;
  SimResult torchtune = RunLowered(s, m);
  ExpectSteadyState(torchtune);
  const uint64_t half_logits = 2 * 512 * m.vocab_size * 2;
  EXPECT_GE(torchtune.phases[4].peak_allocated_bytes, forward_loop + half_logits * 7 / 8);
}

TEST(Lower, OptimizerInBackwardFreesEachGradAtOnce) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.seq = 64;
  s.precision = Precision::kBf16;
  s.optimizer = OptimizerKind::kAdamWFused;
  SimResult normal = RunLowered(s, m);
  s.optimizer_in_backward = true;
  SimResult fused = RunLowered(s, m);
  const uint64_t params = m.ParameterCount() * 2;
  // Step 2's backward ends with weights + moments (+ fused's 4-byte `step`
  // per parameter tensor, one 512-byte block each) and no .grad at all; the
  // usual loop ends it with every .grad alive as well.
  const PhasePeak& nb = normal.phases[5];
  const PhasePeak& fb = fused.phases[5];
  ASSERT_EQ(nb.phase, Phase::kBackward);
  EXPECT_EQ(nb.allocated_at_end_bytes - fb.allocated_at_end_bytes, params);
  EXPECT_LT(fb.peak_allocated_bytes, nb.peak_allocated_bytes);
  // Same state at the end of the run.
  EXPECT_EQ(fused.final_stats.allocated_bytes, normal.final_stats.allocated_bytes);
  s.grad_accum = 2;
  EXPECT_FALSE(LowerTraining(m, s, TestGpu()).ok());
  s.grad_accum = 1;
  s.optimizer = OptimizerKind::kNone;
  EXPECT_FALSE(LowerTraining(m, s, TestGpu()).ok());
}

TEST(Lower, ActivationOffloadMovesSavedTensorsToTheHost) {
  const ModelSpec m = Tiny();
  TrainingSetup s;
  s.batch = 2;
  s.seq = 64;
  s.precision = Precision::kBf16;
  auto normal_lowered = LowerTraining(m, s, TestGpu());
  ASSERT_TRUE(normal_lowered.ok());
  SimResult normal = RunLowered(s, m);
  s.activation_offload = true;
  auto offload_lowered = LowerTraining(m, s, TestGpu());
  ASSERT_TRUE(offload_lowered.ok()) << offload_lowered.error().message;
  SimResult offload = RunLowered(s, m);
  EXPECT_EQ(normal_lowered->host_peak_bytes, 0u);
  // Everything autograd saved in forward lives on the host instead: at least
  // the activations the usual run holds at the end of step 2's forward, plus
  // the weights the matmuls save (save_on_cpu packs parameters too).
  const PhasePeak& fwd = normal.phases[4];
  ASSERT_EQ(fwd.phase, Phase::kForward);
  const uint64_t params = m.ParameterCount() * 2;
  EXPECT_GE(offload_lowered->host_peak_bytes, fwd.allocated_at_end_bytes - 3 * params);
  EXPECT_LT(offload.phases[4].allocated_at_end_bytes, fwd.allocated_at_end_bytes);
  // Steady state and nothing left behind.
  for (int ph = 0; ph < 3; ++ph) {
    EXPECT_EQ(offload.phases[4 + ph].peak_allocated_bytes,
              offload.phases[7 + ph].peak_allocated_bytes);
  }
  EXPECT_EQ(offload.final_stats.allocated_bytes, normal.final_stats.allocated_bytes);
  s.grad_ckpt = GradCkpt::kFull;
  EXPECT_FALSE(LowerTraining(m, s, TestGpu()).ok());
}

// torchtune's OffloadActivations (--impl torchtune with checkpointing): the
// layer inputs go to the host, so the forward ends lower; steady state, and
// nothing left behind on the device or the host. The recipes refuse it
// without checkpointing, and save_on_cpu stays refused with it.
TEST(Lower, TorchtuneOffloadActivationsMovesLayerInputsToTheHost) {
  // Eight layers: more than OffloadActivations' forward stash of five.
  std::string config = lower_testing::kTinyLlama;
  const std::string layers = "\"num_hidden_layers\": 4";
  config.replace(config.find(layers), layers.size(), "\"num_hidden_layers\": 8");
  auto parsed = ParseModelConfig(config, "tiny8");
  ASSERT_TRUE(parsed.ok());
  const ModelSpec m = *parsed;
  TrainingSetup s;
  s.batch = 2;
  s.seq = 64;
  s.precision = Precision::kBf16;
  s.impl = ModelImpl::kTorchtune;
  s.loss = LossKind::kTorchtuneChunked;
  s.grad_ckpt = GradCkpt::kFull;
  SimResult kept = RunLowered(s, m);
  s.activation_offload = true;
  auto lowered = LowerTraining(m, s, TestGpu());
  ASSERT_TRUE(lowered.ok()) << lowered.error().message;
  SimResult offloaded = RunLowered(s, m);
  ExpectSteadyState(offloaded);
  // Eight layer inputs of [b, s, h] bf16 at least (and the final norm's saves).
  EXPECT_GE(lowered->host_peak_bytes, 8 * s.batch * s.seq * m.hidden_size * 2);
  EXPECT_LT(offloaded.phases[4].allocated_at_end_bytes, kept.phases[4].allocated_at_end_bytes);
  EXPECT_EQ(offloaded.final_stats.allocated_bytes, kept.final_stats.allocated_bytes);
  s.grad_ckpt = GradCkpt::kNone;
  auto no_ckpt = LowerTraining(m, s, TestGpu());
  ASSERT_FALSE(no_ckpt.ok());
  EXPECT_NE(no_ckpt.error().message.find("--grad-ckpt full"), std::string::npos);
  s.grad_ckpt = GradCkpt::kFull;
  s.impl = ModelImpl::kTransformers;
  auto save_on_cpu = LowerTraining(m, s, TestGpu());
  ASSERT_FALSE(save_on_cpu.ok());
  EXPECT_NE(save_on_cpu.error().message.find("--impl torchtune"), std::string::npos);
}

}  // namespace
}  // namespace vramscope

namespace vramscope {
namespace {

// --ema (diffusers' EMAModel): an fp32 shadow of every UNet parameter for the
// whole run; after zero_grad, per trainable parameter two fp32 temporaries one
// parameter at a time, or every difference at once with --ema-foreach.
struct EmaCounts {
  uint64_t shadow_bytes = 0;
  size_t most_live_temporaries = 0;  // EMA step temporaries alive at once
  uint64_t temporary_bytes = 0;      // all EMA temporaries of one step
};

EmaCounts CountEma(const ModelSpec& model, bool ema, bool foreach) {
  TrainingSetup t;
  t.batch = 1;
  t.image_size = 256;
  t.steps = 1;
  t.precision = Precision::kFp32;
  t.ema = ema;
  t.ema_foreach = foreach;
  auto lowered = LowerTraining(model, t, TestGpu());
  EXPECT_TRUE(lowered.ok()) << lowered.error().message;
  EmaCounts c;
  std::set<uint64_t> live;
  for (const Event& e : lowered->stream.events()) {
    if (e.kind == EventKind::kFree) live.erase(e.id);
    if (e.kind != EventKind::kAlloc) continue;
    const std::string_view op = lowered->stream.String(e.op);
    if (op == "EMAModel.shadow_params") c.shadow_bytes += e.size_bytes;
    if (lowered->stream.String(e.module) == "ema_unet" &&
        (op == "aten::sub" || op == "aten::mul")) {
      live.insert(e.id);
      c.temporary_bytes += e.size_bytes;
      c.most_live_temporaries = std::max(c.most_live_temporaries, live.size());
    }
  }
  return c;
}

TEST(UNetLower, EmaShadowAndStepTemporaries) {
  auto model = LoadCatalogModel("sd-1.5-unet");
  ASSERT_TRUE(model.ok()) << model.error().message;
  const uint64_t weight_bytes = model->ParameterCount() * 4;
  const EmaCounts none = CountEma(*model, false, false);
  EXPECT_EQ(none.shadow_bytes, 0u);
  EXPECT_EQ(none.temporary_bytes, 0u);
  const EmaCounts loop = CountEma(*model, true, false);
  EXPECT_EQ(loop.shadow_bytes, weight_bytes);
  EXPECT_EQ(loop.temporary_bytes, 2 * weight_bytes);  // (s - p), then decay * that
  EXPECT_EQ(loop.most_live_temporaries, 2u);
  const EmaCounts foreach = CountEma(*model, true, true);
  EXPECT_EQ(foreach.shadow_bytes, weight_bytes);
  EXPECT_EQ(foreach.temporary_bytes, weight_bytes);  // _foreach_sub, then _foreach_sub_
  EXPECT_EQ(foreach.most_live_temporaries, model->params.size());
}

// Every UNet knob combination reaches a steady state (step 2 = step 3) and
// leaves nothing behind; checkpointing keeps less for backward.
TEST(UNetLower, SteadyStateNothingLeaksAndCheckpointingSaves) {
  auto model = LoadCatalogModel("sd-1.5-unet");
  ASSERT_TRUE(model.ok()) << model.error().message;
  for (Precision p :
       {Precision::kFp32, Precision::kBf16, Precision::kBf16Mixed, Precision::kFp16Mixed}) {
    for (Finetune f : {Finetune::kFull, Finetune::kLora}) {
      uint64_t saved[2] = {0, 0};
      for (GradCkpt c : {GradCkpt::kNone, GradCkpt::kFull}) {
        SCOPED_TRACE(testing::Message()
                     << PrecisionName(p) << " " << FinetuneName(f) << " " << GradCkptName(c));
        TrainingSetup s;
        s.batch = 2;
        s.image_size = 128;
        s.precision = p;
        s.finetune = f;
        s.lora_targets = {"q", "k", "v", "o"};
        s.grad_ckpt = c;
        auto lowered = LowerTraining(*model, s, TestGpu());
        ASSERT_TRUE(lowered.ok()) << lowered.error().message;
        SimOptions o;
        o.alloc.ideal = true;
        auto r = Simulate(lowered->stream, o);
        ASSERT_TRUE(r.ok());
        ASSERT_EQ(r->phases.size(), 10u);
        for (int ph = 0; ph < 3; ++ph) {
          EXPECT_EQ(r->phases[4 + ph].peak_allocated_bytes, r->phases[7 + ph].peak_allocated_bytes);
          EXPECT_EQ(r->phases[4 + ph].allocated_at_end_bytes,
                    r->phases[7 + ph].allocated_at_end_bytes);
        }
        // After each backward only parameters, gradients and optimizer state remain.
        EXPECT_EQ(r->phases[5].allocated_at_end_bytes, r->phases[8].allocated_at_end_bytes);
        auto kept = SavedAtEndOfForward(lowered->stream);
        ASSERT_TRUE(kept.has_value());
        saved[c == GradCkpt::kFull] = kept->total_bytes;
      }
      EXPECT_LT(saved[1], saved[0] / 2) << "checkpointing keeps each block's inputs only";
    }
  }
}

}  // namespace
}  // namespace vramscope

namespace vramscope {
namespace {

// A reduced FLUX.1-dev (tools/reference/vsref/models.py FLUX_FAMILIES): the
// guidance embedding, two double and two single blocks, two heads of 16.
ModelSpec TinyFlux() {
  auto parsed = ParseModelConfig(R"({"_class_name": "FluxTransformer2DModel", "patch_size": 1,
      "in_channels": 16, "num_layers": 2, "num_single_layers": 2, "attention_head_dim": 16,
      "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 24,
      "guidance_embeds": true, "axes_dims_rope": [4, 6, 6]})",
                                 "tiny-flux");
  EXPECT_TRUE(parsed.ok()) << parsed.error().message;
  return *parsed;
}

// Every FLUX knob combination reaches a steady state and leaves nothing behind
// (the batch goes with its step); with checkpointing each double block keeps
// only its outputs, the next block's inputs, for backward.
TEST(FluxLower, SteadyStateNothingLeaksAndCheckpointingKeepsBlockInputs) {
  const ModelSpec m = TinyFlux();
  ASSERT_TRUE(m.is_flux);
  const uint64_t b = 2, n = 4 * 4, t = 8, dim = 32;  // 64 px / 8 = 8 latents: 4 x 4 tokens
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kBf16Mixed}) {
    for (Finetune f : {Finetune::kFull, Finetune::kLora}) {
      uint64_t saved[2] = {0, 0};
      for (GradCkpt c : {GradCkpt::kNone, GradCkpt::kFull}) {
        SCOPED_TRACE(testing::Message()
                     << PrecisionName(p) << " " << FinetuneName(f) << " " << GradCkptName(c));
        TrainingSetup s;
        s.batch = b;
        s.image_size = 64;
        s.text_len = t;
        s.precision = p;
        s.finetune = f;
        s.lora_targets = {"q", "k", "v", "o"};
        s.grad_ckpt = c;
        s.attn = Attention::kSdpa;
        auto lowered = LowerTraining(m, s, TestGpu());
        ASSERT_TRUE(lowered.ok()) << lowered.error().message;
        SimOptions o;
        o.alloc.ideal = true;
        auto r = Simulate(lowered->stream, o);
        ASSERT_TRUE(r.ok());
        ExpectSteadyState(*r);
        // Forward and backward end alike in steps 2 and 3 (the optimizer phase
        // of step 2 ends with step 3's batch loaded, step 3's with none).
        for (int ph = 0; ph < 2; ++ph) {
          EXPECT_EQ(r->phases[4 + ph].allocated_at_end_bytes,
                    r->phases[7 + ph].allocated_at_end_bytes);
        }
        if (p == Precision::kBf16 && f == Finetune::kFull) {
          // Weights and AdamW's two moments; .grad and the batch are gone.
          EXPECT_EQ(r->final_stats.allocated_bytes, m.ParameterCount() * 2 * 3);
        }
        auto kept = SavedAtEndOfForward(lowered->stream);
        ASSERT_TRUE(kept.has_value());
        saved[c == GradCkpt::kFull] = kept->total_bytes;
        if (c == GradCkpt::kNone || f != Finetune::kFull) continue;
        const uint64_t bytes = p == Precision::kFp32 ? 4 : 2;
        for (const auto& [block, size] : kept->by_block) {
          if (block.starts_with("transformer_blocks.")) EXPECT_EQ(size, b * (n + t) * dim * bytes);
        }
      }
      EXPECT_LT(saved[1], saved[0] / 2) << "checkpointing keeps each block's inputs only";
    }
  }
}

// What the FLUX lowering does not model is refused, naming the flag.
TEST(FluxLower, Refusals) {
  const ModelSpec m = TinyFlux();
  TrainingSetup s;
  s.attn = Attention::kSdpa;
  s.image_size = 64;
  ASSERT_TRUE(LowerTraining(m, s, TestGpu()).ok());
  for (auto change : std::vector<std::function<void(TrainingSetup*)>>{
           [](TrainingSetup* t) { t->attn = Attention::kEager; },
           [](TrainingSetup* t) { t->grad_ckpt = GradCkpt::kReentrant; },
           [](TrainingSetup* t) { t->image_size = 72; },
           [](TrainingSetup* t) { t->finetune = Finetune::kQLora; },
           [](TrainingSetup* t) { t->loss = LossKind::kChunked; },
           [](TrainingSetup* t) { t->ema = true; },
           [](TrainingSetup* t) { t->parallel.gpus = 2; }}) {
    TrainingSetup bad = s;
    change(&bad);
    EXPECT_FALSE(LowerTraining(m, bad, TestGpu()).ok());
  }
}

// T5ForConditionalGeneration: steady state and nothing left but the weights
// and AdamW's moments for every checkpointing mode, a longer target costing
// more, and the setups it refuses (T5EncoderModel has no head to train).
TEST(T5Lower, SteadyStateAndRefusals) {
  auto parsed = ParseModelConfig(R"({"model_type": "t5", "d_model": 64, "d_kv": 8, "d_ff": 128,
      "num_layers": 2, "num_decoder_layers": 3, "num_heads": 4, "vocab_size": 256,
      "feed_forward_proj": "gated-gelu", "tie_word_embeddings": false})",
                                 "tiny-t5");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  const ModelSpec m = *parsed;
  ASSERT_TRUE(m.is_t5);
  TrainingSetup base;
  base.batch = 2;
  base.seq = 32;
  base.attn = Attention::kEager;
  base.precision = Precision::kBf16;
  for (GradCkpt c : {GradCkpt::kNone, GradCkpt::kFull, GradCkpt::kReentrant}) {
    TrainingSetup s = base;
    s.grad_ckpt = c;
    SimResult r = RunLowered(s, m);
    ASSERT_EQ(r.phases.size(), 10u);
    for (int ph = 0; ph < 3; ++ph) {
      EXPECT_EQ(r.phases[4 + ph].peak_allocated_bytes, r.phases[7 + ph].peak_allocated_bytes);
    }
    EXPECT_EQ(r.final_stats.allocated_bytes, m.ParameterCount() * 2 * 3);
  }
  TrainingSetup longer = base;
  longer.target_len = 64;
  EXPECT_GT(RunLowered(longer, m).peak_allocated_bytes, RunLowered(base, m).peak_allocated_bytes);
  for (auto change : std::vector<std::function<void(TrainingSetup*)>>{
           [](TrainingSetup* t) { t->attn = Attention::kSdpa; },
           [](TrainingSetup* t) { t->transformers_version = 457; },
           [](TrainingSetup* t) { t->precision = Precision::kFp16Mixed; },
           [](TrainingSetup* t) { t->finetune = Finetune::kQLora; },
           [](TrainingSetup* t) { t->loss = LossKind::kChunked; },
           [](TrainingSetup* t) { t->parallel.gpus = 2; }}) {
    TrainingSetup bad = base;
    change(&bad);
    EXPECT_FALSE(LowerTraining(m, bad, TestGpu()).ok());
  }
  auto encoder = ParseModelConfig(
      R"({"model_type": "t5", "architectures": ["T5EncoderModel"], "d_model": 64, "num_heads": 4})",
      "tiny-t5-encoder");
  ASSERT_TRUE(encoder.ok()) << encoder.error().message;
  EXPECT_FALSE(LowerTraining(*encoder, base, TestGpu()).ok());
}

// T5EncoderModel's no-grad forward (t5.h, for a frozen text encoder): bf16
// weights, input_ids [2, 16]; no node is recorded, so only the weights and the
// returned [2, 16, d_model] output are left, and the peak holds at least one
// layer's eager scores [2, heads, 16, 16] beside them.
TEST(T5Lower, EncoderNoGradForwardLeavesOnlyItsOutput) {
  using namespace lower;  // NOLINT: the lowering's internals (t5.h, tape.h)
  const ModelSpec m = TinyT5Encoder(8, 2);
  EventStream stream;
  Tape tape(&stream);
  PlaceFrozenHalfParams(tape, m);
  auto tp = IndexT5Params(m, tape.params);
  ASSERT_TRUE(tp.ok()) << tp.error().message;
  TrainingSetup eager;
  eager.attn = Attention::kEager;
  Var out = T5EncoderNoGrad(tape, m, *tp, eager, 2, 16);
  EXPECT_EQ(out.numel, 2u * 16 * 64);
  EXPECT_EQ(out.elem_bytes, kHalf);
  EXPECT_FALSE(out.requires_grad());
  SimOptions o;
  o.alloc.ideal = true;
  auto sim = Simulate(stream, o);
  ASSERT_TRUE(sim.ok());
  EXPECT_EQ(sim->final_stats.allocated_bytes, m.ParameterCount() * 2 + out.bytes());
  EXPECT_GE(sim->peak_allocated_bytes, m.ParameterCount() * 2 + 2u * 4 * 16 * 16 * 2);
}
// The grid's reduced SD-1.5-like UNet (tools/reference/vsref/models.py "unet_sd15").
ModelSpec TinyUNet() {
  auto parsed = ParseModelConfig(R"({"_class_name": "UNet2DConditionModel", "sample_size": 8,
      "block_out_channels": [32, 64, 64], "down_block_types": ["CrossAttnDownBlock2D",
      "CrossAttnDownBlock2D", "DownBlock2D"], "up_block_types": ["UpBlock2D",
      "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"], "cross_attention_dim": 32,
      "attention_head_dim": 8, "norm_num_groups": 8})",
                                 "tiny-unet");
  EXPECT_TRUE(parsed.ok()) << parsed.error().message;
  return *parsed;
}

// The grid's reduced VAE (tools/reference/vsref/models.py "vae_sd" / "vae_flux").
std::shared_ptr<const ModelSpec> TinyVae(bool flux) {
  const std::string extra = flux ? R"(, "use_quant_conv": false, "use_post_quant_conv": false,
      "shift_factor": 0.1159)"
                                 : "";
  auto parsed = ParseModelConfig(R"({"_class_name": "AutoencoderKL", "block_out_channels":
      [32, 32, 64, 64], "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D",
      "DownEncoderBlock2D", "DownEncoderBlock2D"], "up_block_types": ["UpDecoderBlock2D",
      "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"], "layers_per_block": 1,
      "norm_num_groups": 8)" + extra +
                                     "}",
                                 "tiny-vae");
  EXPECT_TRUE(parsed.ok()) << parsed.error().message;
  return std::make_shared<const ModelSpec>(*parsed);
}

// --vae adds the frozen VAE's weights (in the weight dtype) for the whole run
// and an encode that saves nothing: the same tensors are saved for backward,
// the steady state holds, and the step ends with only the weights added.
TEST(VaeLower, WeightsAddedEncodeSavesNothing) {
  for (bool flux : {false, true}) {
    const ModelSpec m = flux ? TinyFlux() : TinyUNet();
    for (Precision p : {Precision::kFp32, Precision::kBf16Mixed}) {
      SCOPED_TRACE(testing::Message() << (flux ? "flux " : "unet ") << PrecisionName(p));
      TrainingSetup s;
      s.batch = 2;
      s.image_size = 64;
      s.text_len = 8;
      s.precision = p;
      s.attn = Attention::kSdpa;
      auto plain = LowerTraining(m, s, TestGpu());
      ASSERT_TRUE(plain.ok()) << plain.error().message;
      s.vae = TinyVae(flux);
      s.vae_name = "tiny-vae";
      auto with_vae = LowerTraining(m, s, TestGpu());
      ASSERT_TRUE(with_vae.ok()) << with_vae.error().message;
      SimOptions o;
      o.alloc.ideal = true;
      auto a = Simulate(plain->stream, o);
      auto b = Simulate(with_vae->stream, o);
      ASSERT_TRUE(a.ok() && b.ok());
      ExpectSteadyState(*b);
      const uint64_t weights = s.vae->ParameterCount() * (p == Precision::kFp32 ? 4 : 2);
      EXPECT_EQ(b->final_stats.allocated_bytes, a->final_stats.allocated_bytes + weights);
      EXPECT_EQ(SavedAtEndOfForward(with_vae->stream)->total_bytes,
                SavedAtEndOfForward(plain->stream)->total_bytes);
      s.vae_scale = 4;
      EXPECT_FALSE(LowerTraining(m, s, TestGpu()).ok());
    }
  }
}

}  // namespace
}  // namespace vramscope
