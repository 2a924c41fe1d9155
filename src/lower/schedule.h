// The order of forward and backward passes within one optimizer step: one GPU,
// Megatron's 1F1B pipeline schedule, and its interleaved form. Pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vramscope::lower {

struct Pass {
  bool forward = true;  // else: the backward of the oldest forward of `chunk`
  size_t chunk = 0;     // model chunk of this stage (interleaved: 0..chunks-1)
  bool operator==(const Pass&) const = default;
};

// Megatron-LM schedules.py (core 0.5-0.13): `warmup` forwards, then one
// forward and one backward at a time, then the remaining backwards. With
// `chunks` > 1 (interleaved 1F1B) the k-th forward runs chunk (k mod (pp *
// chunks)) / pp and the k-th backward the reverse (get_model_chunk_id). One
// GPU (pp = 1, warmup 0): F, B, F, B, ... `warmup` is capped at the passes.
std::vector<Pass> PipelineSchedule(uint64_t micro_batches, uint64_t chunks, uint64_t warmup,
                                   uint32_t pp);

}  // namespace vramscope::lower
