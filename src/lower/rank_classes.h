// Which ranks of a parallel layout differ in memory, and what each runs:
// Megatron-style tensor / expert parallelism reshapes the model one rank
// holds, pipeline parallelism gives each stage a span of layers and a number
// of micro-batches in flight. Ranks with the same memory form one class.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transformer.h"
#include "vramscope/lower.h"
#include "vramscope/model.h"
#include "vramscope/parallel.h"
#include "vramscope/result.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

struct RankClassPlan {
  std::string name;        // "all ranks", "first stage", "middle stages", "last stage"
  std::vector<int> ranks;  // global ranks in Megatron order (tp fastest, then cp, dp, pp)
  uint32_t stage = 0;      // the pipeline stage simulated for the class
  // The data-parallel rank simulated for the class: DeepSpeed ZeRO-1/2 give
  // each rank a different partition of the flat parameters (sharding_zero12.cc).
  uint32_t dp_rank = 0;
  // The model chunks the stage runs: one, or virtual_stages with the
  // interleaved schedule (chunk c is virtual stage c * pp + stage).
  std::vector<StageSpan> chunks = {StageSpan{}};
  // Megatron schedules.py: 1F1B (forward_backward_pipelining_without_
  // interleaving) runs min(pp - s - 1, m) warm-up forwards before its first
  // backward; interleaved, (pp - s - 1) * 2 + (v - 1) * pp chunk forwards
  // (at most m * v).
  uint32_t warmup = 0;
};

// The model one rank holds under tensor parallelism (Megatron-LM core
// ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding) and
// expert parallelism (E/ep local experts). Errors name the flag and the
// model dimension that does not divide.
Result<ModelSpec> ShardModel(const ModelSpec& model, const TrainingSetup& setup);

// Whether ShardModel changes the model (tensor or expert parallelism); when
// not, callers that only read it use the model as it is instead of a copy
// (a 10 000-layer model's copy is most of a plan's budget check).
inline bool ShardsModel(const TrainingSetup& setup) {
  return setup.parallel.tp != 1 || setup.parallel.ep != 1;
}

// The rank classes of the layout: one when pp == 1, except under DeepSpeed
// ZeRO stages 1-2, where every data-parallel rank's partition differs (one
// class per rank up to 8; beyond, ranks 0, 1 and the last, rank 1 standing
// for the ranks between).
Result<std::vector<RankClassPlan>> PlanRankClasses(const ModelSpec& model,
                                                   const TrainingSetup& setup);

// Micro-batches the lowering simulates per optimizer step for `plan`: the
// requested ones (--microbatches under pipeline parallelism, else
// --grad-accum), but with one model chunk per stage 1F1B repeats the same
// memory pattern after its warm-up, so only warm-up + 2 are simulated.
uint64_t SimulatedMicroBatches(const TrainingSetup& setup, const RankClassPlan& plan);

// The work budget's bound (vramscope/lower.h, EstimateLoweringWork) for the
// rank classes `plans` of the sharded model `local` (work_budget.cc).
LoweringWork WorkOf(const ModelSpec& local, const TrainingSetup& setup,
                    const std::vector<RankClassPlan>& plans);

// Bytes NCCL keeps on each rank for its communicators, outside PyTorch's
// allocator (docs/parallel.md: how it is estimated).
uint64_t NcclBytes(const ParallelLayout& layout);

}  // namespace vramscope::lower
