// Lowering of diffusers' FluxTransformer2DModel training step (diffusers 0.42.1
// models/transformers/transformer_flux.py, examples/dreambooth/
// train_dreambooth_flux.py and train_dreambooth_lora_flux.py): the transformer
// predicts the flow-matching velocity of noisy latents packed 2 x 2 into
// tokens, conditioned on the timestep, the guidance scale (FLUX.1-dev), the
// pooled CLIP projection and the T5 hidden states, and the loss is
// mean((weighting * (pred - target)^2).reshape(b, -1), 1).mean() in fp32. The
// VAE and the text encoders are frozen and run outside the graph: their outputs
// arrive as inputs in the scripts' weight_dtype.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "tape.h"
#include "transformer.h"
#include "vramscope/model.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// tape.params by parameter name ("transformer_blocks.0.attn.to_q.weight").
using FluxParams = std::unordered_map<std::string, Param*>;

// Indexes tape.params; an Error names the first module the forward needs and
// cannot find.
Result<FluxParams> IndexFluxParams(const ModelSpec& spec, std::vector<Param>& params);

// The latent side for this setup: --image-size / --vae-scale (default: 512
// pixels, the dreambooth scripts' --resolution). An Error when the image does
// not divide into 2 x 2 latent patches.
Result<uint64_t> FluxLatentSide(const TrainingSetup& setup);

// One micro-batch's inputs as the training loop holds them (the VAE's latents
// packed and noised, the text encoders' states, the ids, the target and the
// loss weighting): made before the forward, kept until the step is over. The
// text states that frozen encoders make on the GPU (--text-encoder) are left
// empty (kNoTensor) in their slots for the encoders' outputs.
inline constexpr size_t kFluxPooledSlot = 3, kFluxStatesSlot = 4;
std::vector<Var> MakeFluxBatch(Tape& tape, const ModelSpec& spec, const TrainingSetup& setup,
                               bool pooled_from_encoder = false, bool states_from_encoder = false);

// One micro-batch forward and the loss over `batch` (the caller's).
ForwardOut FluxForward(Tape& tape, const ModelSpec& spec, FluxParams& params,
                       const TrainingSetup& setup, const std::vector<Var>& batch);

}  // namespace vramscope::lower
