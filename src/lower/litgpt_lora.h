// LitGPT's LoRA layers (litgpt/lora.py 0.5.13) as memory sees them, under
// --impl litgpt: LoRALinear for the attention projection, the MLP and the
// head, and LoRAQKVLinear over the fused qkv (one adapter pair for the q, k
// and v slices it adapts: a grouped conv1d, then zero padding when a slice
// has none). Same conventions as ops.h.
#pragma once

#include <cstdint>

#include "tape.h"

namespace vramscope::lower {

// `weight.lora_a` >= 0. A weight with `litgpt_qkv.q_out` set is the fused
// qkv's LoRAQKVLinear, any other LoRALinear.
Var LitgptLoraLinear(Tape& tape, const Var& x, Param& weight, Param* bias, uint64_t tokens,
                     uint64_t out_features);

}  // namespace vramscope::lower
