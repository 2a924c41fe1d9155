// Lowering: a model and a training setup become the event stream of a
// training run on one GPU, tensor by tensor, as PyTorch eager + transformers
// (+ PEFT, bitsandbytes) execute it. Each rule names the library behaviour
// and version it follows (src/lower/*.cc, docs/lowering.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "vramscope/event_stream.h"
#include "vramscope/gpu.h"
#include "vramscope/model.h"
#include "vramscope/result.h"
#include "vramscope/setup.h"

namespace vramscope {

struct Lowered {
  EventStream stream;
  uint64_t parameters = 0;  // all parameters (LoRA adapters included)
  uint64_t trainable_parameters = 0;
  uint64_t managed_bytes = 0;      // device memory outside the allocator (paged optimizer state)
  uint64_t host_peak_bytes = 0;    // pinned host memory (activation offloading)
  std::vector<std::string> notes;  // assumptions worth telling the user
};

// One class of GPU ranks whose memory is the same (all ranks on one GPU or
// under pure data parallelism; first / middle / last pipeline stages).
struct LoweredRank {
  std::string rank_class;   // "all ranks", "first stage", ...
  std::vector<int> ranks;   // global ranks in the class
  uint64_t nccl_bytes = 0;  // NCCL communicator buffers (outside the allocator)
  Lowered lowered;          // the class's event stream (the worst rank of it)
};

// Validates the setup and its parallel layout against the model (one-line
// Error naming the knob) and lowers `setup.steps` optimizer steps for each
// rank class of setup.parallel.
// `each`, when given, is called once per class with its index, on the
// thread that lowered it (classes are lowered concurrently; it must not touch
// another class); an error it returns fails the whole call.
using RankClassCallback = std::function<Status(size_t index, LoweredRank& lowered)>;
Result<std::vector<LoweredRank>> LowerRankClasses(const ModelSpec& model,
                                                  const TrainingSetup& setup, const GpuSpec& gpu,
                                                  const RankClassCallback& each = {});

// Knobs that are allowed but probably not what the user meant (a sequence
// beyond the model's positions, library versions outside those the rules were
// read from): one line each, for stderr. Impossible combinations are errors of
// LowerRankClasses instead.
std::vector<std::string> SetupWarnings(const ModelSpec& model, const TrainingSetup& setup);

// The first rank class of LowerRankClasses (the only one on a single GPU).
Result<Lowered> LowerTraining(const ModelSpec& model, const TrainingSetup& setup,
                              const GpuSpec& gpu);

}  // namespace vramscope
