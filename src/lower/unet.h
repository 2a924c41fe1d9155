// Lowering of diffusers' UNet2DConditionModel training step (diffusers 0.42.1
// examples/text_to_image/train_text_to_image.py and train_text_to_image_lora.py):
// the UNet predicts the noise of noisy latents, conditioned on the timestep and
// the text encoder's hidden states, and the loss is
// F.mse_loss(model_pred.float(), target.float(), reduction="mean"). The VAE and
// the text encoder are frozen and run outside the UNet's graph: their outputs
// (latents, encoder_hidden_states) arrive as inputs in the weight dtype.
#pragma once

#include <string>
#include <unordered_map>

#include "tape.h"
#include "transformer.h"
#include "vramscope/model.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// tape.params by parameter name ("down_blocks.0.resnets.0.conv1.weight").
using UNetParams = std::unordered_map<std::string, Param*>;

// Indexes tape.params; an Error names the first module the forward needs and
// cannot find.
Result<UNetParams> IndexUNetParams(const ModelSpec& spec, std::vector<Param>& params);

// The latent side the UNet sees for this setup: --image-size / --vae-scale, or
// the config's sample_size. An Error when the image does not divide.
Result<uint64_t> UNetLatentSide(const ModelSpec& spec, const TrainingSetup& setup);

// One micro-batch forward and the loss.
ForwardOut UNetForward(Tape& tape, const ModelSpec& spec, UNetParams& params,
                       const TrainingSetup& setup);

}  // namespace vramscope::lower
