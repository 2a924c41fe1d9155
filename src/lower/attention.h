// Attention kernels as memory sees them.
#pragma once

#include <cstdint>

#include "tape.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

struct AttnShape {
  uint64_t batch = 1, seq = 1;
  uint64_t heads = 1, kv_heads = 1, head_dim = 1;
  uint64_t tokens() const { return batch * seq; }
};

// Which kernel PyTorch / transformers end up running.
enum class AttnKernel : uint8_t {
  kFlash,      // flash-attn 2 package, or SDPA's flash / cuDNN / efficient kernels
  kMath,       // eager attention, or SDPA's math fallback: materializes b*a*s*s
};

struct AttnPlan {
  AttnKernel kernel = AttnKernel::kFlash;
  bool repeat_kv = false;     // k/v expanded to all query heads before the kernel
  bool gqa_native = true;     // kernel reads kv heads directly (no expansion)
  bool fp32_softmax = true;   // eager: softmax(..., dtype=float32)
  bool causal_mask_tensor = false;  // a (b,1,s,s) mask tensor is built
};

// Decides the kernel for a training forward without padding.
// transformers (>= 4.48 sdpa_attention.py): repeat_kv unless use_gqa_in_sdpa
// (torch >= 2.5 and no mask); is_causal=True without a mask, so PyTorch's SDPA
// dispatcher picks flash (fp16/bf16, sm80+) or memory-efficient (fp32) kernels.
AttnPlan PlanAttention(const TrainingSetup& setup, uint8_t compute_bytes, uint64_t heads,
                       uint64_t kv_heads, bool sliding_window_mask);

// q: [b, heads, s, d]; k, v: [b, kv_heads, s, d] (borrowed). Returns the
// attention output laid out as [b, s, heads*d] ready for o_proj.
Var Attend(Tape& tape, const AttnPlan& plan, const AttnShape& shape, const Var& q,
           const Var& k, const Var& v, const Var* mask, double dropout);

}  // namespace vramscope::lower
