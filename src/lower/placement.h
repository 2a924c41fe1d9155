// Setup of one rank's model: parameters as from_pretrained / from_config place
// them (dtype, 4-bit storage, the pipeline stage's share), the buffers
// model.to(device) moves beside them, and PEFT's LoRA adapters.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tape.h"
#include "transformer.h"
#include "vramscope/model.h"
#include "vramscope/result.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// The weights' dtype: 16-bit under --precision bf16 / fp16, else fp32 (the
// *-mixed modes keep fp32 weights under autocast).
inline uint8_t ParamBytes(Precision p) {
  return p == Precision::kFp16 || p == Precision::kBf16 ? kHalf : kF32;
}

// transformers >= 5.0 stores routed experts as 3-D nn.Parameters, not nn.Linear.
bool IsStackedExpert(const ParamTensor& pt, int transformers_version);
// Whether PEFT's target_modules (--lora-targets) wrap this weight.
bool IsLoraTarget(const ParamTensor& pt, const std::vector<std::string>& targets,
                  int transformers_version);
// Elements of the LoRA adapters PEFT attaches to `pt` (lora_A + lora_B); 0 when none.
uint64_t LoraAdapterParams(const ParamTensor& pt, const TrainingSetup& setup);

// Bytes a parameter occupies on this GPU: the whole storage, or the shard a
// sharding strategy keeps (ShardingStrategy::StorageBytes).
using StorageBytesFn = std::function<uint64_t(const Param&)>;

struct PlacementRules {
  uint8_t param_bytes = 4;     // the loaded dtype (2: bf16/fp16 weights, or a half-cast engine)
  bool sharded_qlora = false;  // QLoRA under FSDP / ZeRO-3: no prepare_model_for_kbit_training
  StorageBytesFn storage;      // per parameter, as allocated on this rank
};

// Appends one Param per model.params entry to tape.params (in order: indices
// match), allocates those on the rank's pipeline chunks, then the buffers.
void PlaceParameters(Tape& tape, const ModelSpec& model, const TrainingSetup& setup,
                     const std::vector<StageSpan>& chunks, const PlacementRules& rules);

// PEFT get_peft_model: lora_A and lora_B for every targeted weight on this
// rank, trainable, fp32. Returns the adapters' elements; an error when the
// targets match no linear layer of a whole model.
Result<uint64_t> AttachLoraAdapters(Tape& tape, const ModelSpec& model, const TrainingSetup& setup,
                                    bool whole_model, const StorageBytesFn& storage);

}  // namespace vramscope::lower
