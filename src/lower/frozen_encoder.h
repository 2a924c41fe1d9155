// --text-encoder: the frozen text encoders a diffusion step keeps on the GPU
// (diffusers 0.42.1 examples; docs/lowering.md "Frozen text encoders").
//
// The hook a diffusion step calls: PlaceFrozenEncoders once at setup (the
// weights), RunFrozenEncoders each micro-batch before the denoiser's forward.
// Each dispatches on the encoder's family: a CLIP text tower (clip.h) or, for
// FLUX, a T5EncoderModel (t5.h).
#pragma once

#include <memory>
#include <vector>

#include "clip.h"
#include "t5.h"
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
  ClipParams clip;  // a CLIP text tower's index
  T5Params t5;      // a T5EncoderModel's index
  // SDXL's encode_prompt: output_hidden_states=True, hidden_states[-2] handed on.
  bool penultimate = false;
  bool flux = false;  // FluxPipeline's encode_prompt (pooled output only, repeat copies)
  uint64_t text_len = 0;
};

// Refuses encoders the lowering does not model, naming the flag and the
// model: a denoiser other than a diffusion UNet / FLUX transformer, a family
// other than a CLIP text tower or (FLUX only) a T5EncoderModel, a text length
// past a CLIP encoder's positions, fp16 for T5.
Status ValidateFrozenEncoders(const ModelSpec& denoiser, const TrainingSetup& setup);

// `text_encoder.to(accelerator.device, dtype=weight_dtype)`: every encoder's
// weights allocated in the scripts' weight_dtype (fp32 under --precision
// fp32, else 16-bit), in --text-encoder order. Empty without the flag.
Result<std::vector<FrozenEncoder>> PlaceFrozenEncoders(Tape& tape, const ModelSpec& denoiser,
                                                       const TrainingSetup& setup);

// The text states a FLUX step's encoders hand on (FluxPipeline.encode_prompt:
// CLIP's pooled state, T5's states; the repeat copies), which take their
// slots in the FLUX batch (flux.h). Empty (kNoTensor) for a UNet, whose
// lowering makes its own text states, and for a state no encoder makes.
struct HandedOn {
  Var pooled, states;
};

// Which FLUX text states the encoders make (so MakeFluxBatch leaves them out):
// `pooled` with a CLIP text encoder, `states` with a T5 one.
struct FluxTextFromEncoders {
  bool pooled = false, states = false;
};
FluxTextFromEncoders FluxTextSources(const ModelSpec& denoiser, const TrainingSetup& setup);

// One micro-batch's encoder forwards, before the denoiser's: the tokenized
// prompt [b, text_len] (int64), the forward without autocast (accelerate's
// prepare wraps the denoiser only) and without a graph (frozen weights, integer
// inputs). A UNet's states are its own inputs (encoder_hidden_states,
// text_embeds: same sizes, in weight_dtype), which its lowering makes, so the
// encoders' outputs are released here; a FLUX step's are handed on.
HandedOn RunFrozenEncoders(Tape& tape, const TrainingSetup& setup,
                           std::vector<FrozenEncoder>& encoders);

}  // namespace vramscope::lower
