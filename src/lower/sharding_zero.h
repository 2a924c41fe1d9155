// What DeepSpeed's ZeRO stages 1-2 (sharding_zero12.cc) and 3
// (sharding_zero3.cc) share (DeepSpeed 0.19.8).
#pragma once

#include <cstdint>

#include "sharding.h"

namespace vramscope::lower {

// get_norm_dtype() is torch.double wherever the accelerator has fp64
// (runtime/zero/utils.py; CUDA and CPU do): a gradient norm starts with a
// double copy of the gradient (`g.to(get_norm_dtype()).norm(2)`), freed once
// the norm is taken. Allocates and frees 8 * numel bytes.
void NormTemporary(ShardState& s, uint64_t numel);

}  // namespace vramscope::lower
