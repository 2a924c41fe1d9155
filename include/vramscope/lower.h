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

// The work budget (docs/hardening.md, "Work budget"): an upper bound on the
// events lowering `setup` produces, computed from the model's shape before
// anything is lowered, so that a setup whose fields are each within their
// limits but whose product is not (10 000 layers, 16 384 experts,
// --grad-accum 4096 --steps 16) is refused in microseconds instead of
// running out of memory. The bound is the product of the factors below
// (plus a constant per layer stack), each rank class counted as the worst.
struct LoweringWork {
  uint64_t events = 0;  // saturates at 2^64 - 1
  uint64_t layers = 0;  // decoder / encoder layers of the largest rank class
  // Events of one layer in one micro-batch (forward + backward), an upper
  // bound measured over every family and knob (1024), plus per local expert
  // 128 with transformers < 5 (one nn.Linear per expert) or 32.
  uint64_t events_per_layer = 0;
  // Layers of the frozen models run each micro-batch (--text-encoder, --vae),
  // at most 1024 events each.
  uint64_t frozen_layers = 0;
  uint64_t micro_batches = 0;  // simulated per step (the optimizer counts as one more)
  uint64_t steps = 0;
  uint64_t rank_classes = 0;
};

// The bound for `setup` (its parallel layout checked as LowerRankClasses
// does: an invalid layout is an Error here too).
Result<LoweringWork> EstimateLoweringWork(const ModelSpec& model, const TrainingSetup& setup);

// "about 61 440 000 events (10000 layers x 1024 events per layer x (1
// micro-batch + 1 optimizer step) x 3 steps x 1 rank class)": the product,
// for messages.
std::string DescribeWork(const LoweringWork& work);

// The Error LowerRankClasses returns when `work` is over `max_events`, with
// the product, the limit and the flag that raises it.
Status CheckWorkBudget(const LoweringWork& work, uint64_t max_events);

// Knobs that are allowed but probably not what the user meant (a sequence
// beyond the model's positions, library versions outside those the rules were
// read from): one line each, for stderr. Impossible combinations are errors of
// LowerRankClasses instead.
std::vector<std::string> SetupWarnings(const ModelSpec& model, const TrainingSetup& setup);

// The first rank class of LowerRankClasses (the only one on a single GPU).
Result<Lowered> LowerTraining(const ModelSpec& model, const TrainingSetup& setup,
                              const GpuSpec& gpu);

}  // namespace vramscope
