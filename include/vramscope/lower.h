// Lowering: a model and a training setup become the event stream of a
// training run on one GPU, tensor by tensor, as PyTorch eager + transformers
// (+ PEFT, bitsandbytes) execute it. Each rule names the library behaviour
// and version it follows (src/lower/*.cc, docs/lowering.md).
#pragma once

#include <cstdint>
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
  uint64_t parameters = 0;            // all parameters (LoRA adapters included)
  uint64_t trainable_parameters = 0;
  uint64_t managed_bytes = 0;         // device memory outside the allocator (paged optimizer state)
  uint64_t host_peak_bytes = 0;       // pinned host memory (activation offloading)
  std::vector<std::string> notes;     // assumptions worth telling the user
};

// Validates the setup against the model (one-line Error naming the knob) and
// lowers `setup.steps` optimizer steps.
Result<Lowered> LowerTraining(const ModelSpec& model, const TrainingSetup& setup,
                              const GpuSpec& gpu);

}  // namespace vramscope
