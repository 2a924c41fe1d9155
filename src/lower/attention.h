// Attention kernels as memory sees them.
#pragma once

#include <cstdint>

#include "tape.h"
#include "vramscope/model.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

struct AttnShape {
  uint64_t batch = 1, seq = 1;
  uint64_t heads = 1, kv_heads = 1, head_dim = 1;
  // k and v are laid out [b, kv_heads, s, d] in memory (DynamicCache's
  // torch.cat copies); otherwise they are transposed views of a projection.
  bool kv_head_major = false;
  bool causal = true;  // false for encoders (BERT)
  // q is laid out [b, heads, s, d] (partial rotary's torch.cat); else it is a
  // transposed view of the projection.
  bool q_head_major = false;
  // k likewise (the same torch.cat).
  bool k_head_major = false;
  uint64_t tokens() const { return batch * seq; }
};

// Which kernel PyTorch / transformers end up running.
enum class AttnKernel : uint8_t {
  kFlash,  // flash-attn 2 package, or SDPA's flash / cuDNN / efficient kernels
  kMath,   // eager attention, or SDPA's math fallback: materializes b*a*s*s
  // CPU rules only (DeviceRules::kCpu, the fidelity check):
  kCpuFlash,  // _scaled_dot_product_flash_attention_for_cpu
  kSdpaMath,  // _scaled_dot_product_attention_math as SDPA runs it on CPU
};

struct AttnPlan {
  AttnKernel kernel = AttnKernel::kFlash;
  bool repeat_kv = false;           // k/v expanded to all query heads before the kernel
  bool gqa_native = true;           // kernel reads kv heads directly (no expansion)
  bool fp32_softmax = true;         // eager: softmax(..., dtype=float32)
  bool probs_to_v_dtype = false;    // eager: probabilities cast to v's dtype (GPT-2)
  bool causal_mask_tensor = false;  // a (b,1,s,s) mask tensor is built
  // k/v keep fewer heads than q into the kernel without enable_gqa
  // (KvSharing::kBroadcast): matmul copies them to every head.
  bool kv_broadcast = false;
  // Gemma 2's attn_logit_softcapping in eager attention: scores / cap, tanh,
  // * cap (modeling_gemma2.py eager_attention_forward, 4.57 / 5.x).
  bool softcap = false;
  // StableLmAttention's own eager code (transformers 4.x, read in 4.57.6):
  // `attn_weights += causal_mask` in place, and the weights are not returned
  // (`attn_weights = None` unless output_attentions) but live to its end.
  bool legacy_stablelm = false;
  // BertSelfAttention.forward's own eager code (transformers 4.x, read in
  // 4.57.6 models/bert/modeling_bert.py): `attention_scores / math.sqrt(d)`
  // (aten::div), `attention_scores = attention_scores + attention_mask`, and
  // the local `attention_scores` keeps the masked scores until the function
  // returns (softmax's result is bound to `attention_probs` instead).
  bool legacy_bert = false;
  // SDPA's backward keeps a float attn_mask (ScaledDotProductFlashAttention*
  // Backward0 saves it). Set where the mask would otherwise die before the
  // layer's backward: CLIP's 4.57.6 text tower under autocast, whose SDPA call
  // casts the fp32 mask to a [b, 1, s, s] copy per layer.
  bool save_float_mask = false;
};

// Decides the kernel for a training forward without padding.
// transformers (>= 4.48 sdpa_attention.py): repeat_kv unless use_gqa_in_sdpa
// (torch >= 2.5 and no mask); is_causal=True without a mask, so PyTorch's SDPA
// dispatcher picks flash (fp16/bf16, sm80+) or memory-efficient (fp32) kernels.
// `dropout` is the attention dropout transformers passes in training.
AttnPlan PlanAttention(const TrainingSetup& setup, uint8_t compute_bytes, uint64_t heads,
                       uint64_t kv_heads, bool sliding_window_mask, double dropout,
                       KvSharing sharing = KvSharing::kAttentionInterface);

// q: [b, heads, s, d]; k, v: [b, kv_heads, s, d] (borrowed). Returns the
// attention output laid out as [b, s, heads*d] ready for o_proj.
// `weights`, when given, receives a reference to eager attention's returned
// attention weights (kNoTensor for the fused kernels), which the caller's
// `hidden_states, _ = self.self_attn(...)` keeps until its layer returns.
Var Attend(Tape& tape, const AttnPlan& plan, const AttnShape& shape, const Var& q, const Var& k,
           const Var& v, const Var* mask, double dropout, Var* weights = nullptr);

// The eager kernel's pieces, for attention written outside Attend (t5.cc,
// where queries and keys differ in length and a position bias is added):
// torch.bmm with BmmBackward0's saves; torch.matmul's operand, a copy when a
// transposed [b, s, heads * d] view cannot merge b and heads (a view for a
// head-major tensor or one row); softmax without a dtype (fp32 under CUDA
// autocast).
Var AttnBmm(Tape& tape, const Var& a, const Var& b, uint64_t numel, uint8_t bytes);
Var AttnMatmulOperand(Tape& tape, const Var& x, bool head_major, uint64_t batch);
Var AttnSoftmaxNoDtype(Tape& tape, const Var& w);

}  // namespace vramscope::lower
