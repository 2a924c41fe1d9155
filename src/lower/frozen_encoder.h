// --text-encoder: the frozen text encoders a diffusion step keeps on the GPU
// (diffusers 0.42.1 examples; docs/lowering.md "Frozen text encoders").
//
// The hook a diffusion step calls, kept in this file so that other encoder
// families (T5) slot in beside CLIP: PlaceFrozenEncoders once at setup (the
// weights), RunFrozenEncoders each micro-batch before the denoiser's forward.
// Each dispatches on the encoder's family (ModelSpec::is_clip today).
#pragma once

#include <memory>
#include <vector>

#include "clip.h"
#include "tape.h"
#include "vramscope/model.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// One frozen encoder: its resolved config, its weights (not in tape.params:
// nothing trains them and the optimizer never sees them) and the family's
// index over them.
struct FrozenEncoder {
  std::shared_ptr<const ModelSpec> spec;
  std::vector<Param> params;
  ClipParams clip;
  // SDXL's encode_prompt: output_hidden_states=True, hidden_states[-2] handed on.
  bool penultimate = false;
  uint64_t text_len = 0;
};

// Refuses encoders the lowering does not model, naming the flag and the
// model: a denoiser other than a diffusion UNet / FLUX transformer, a family
// other than a CLIP text tower, a text length past the encoder's positions.
Status ValidateFrozenEncoders(const ModelSpec& denoiser, const TrainingSetup& setup);

// `text_encoder.to(accelerator.device, dtype=weight_dtype)`: every encoder's
// weights allocated in the scripts' weight_dtype (fp32 under --precision
// fp32, else 16-bit), in --text-encoder order. Empty without the flag.
Result<std::vector<FrozenEncoder>> PlaceFrozenEncoders(Tape& tape, const ModelSpec& denoiser,
                                                       const TrainingSetup& setup);

// One micro-batch's encoder forwards, before the denoiser's: the tokenized
// prompt [b, text_len] (int64), the forward without autocast (accelerate's
// prepare wraps the denoiser only) and without a graph (frozen weights, integer
// inputs). The states handed on are the denoiser's own inputs
// (encoder_hidden_states, text_embeds, pooled_projections: same sizes, in
// weight_dtype), which its lowering already makes: the encoder's outputs go
// here.
void RunFrozenEncoders(Tape& tape, const TrainingSetup& setup,
                       std::vector<FrozenEncoder>& encoders);

}  // namespace vramscope::lower
