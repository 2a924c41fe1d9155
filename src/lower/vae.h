// The frozen AutoencoderKL of the diffusion training steps (--vae): its weights
// on the GPU and the encode each micro-batch runs before the denoiser.
//
// diffusers' example scripts (examples/text_to_image/train_text_to_image.py and
// train_text_to_image_lora.py, examples/dreambooth/train_dreambooth_flux.py and
// train_dreambooth_lora_flux.py; not in the pip package: read in the GitHub
// tree at 0.40.0.dev0, the modules they call are diffusers 0.42.1's) load the
// whole AutoencoderKL, freeze it
// (`vae.requires_grad_(False)`) and move it to the GPU in weight_dtype
// (`vae.to(accelerator.device, dtype=weight_dtype)`: fp32, or half under mixed
// precision); every step encodes the data loader's fp32 pixel_values outside
// accelerate's autocast (only the prepared denoiser's forward is wrapped):
//   UNet: latents = vae.encode(pixel_values.to(weight_dtype)).latent_dist.sample()
//         latents = latents * vae.config.scaling_factor
//   FLUX: pixel_values = batch["pixel_values"].to(dtype=vae.dtype)
//         model_input = vae.encode(pixel_values).latent_dist.sample()
//         model_input = (model_input - shift_factor) * scaling_factor
// Nothing in the VAE requires grad, so autograd records nothing: every tensor
// goes when its last Python reference does. The decoder is loaded, never run.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "tape.h"
#include "vramscope/model.h"
#include "vramscope/setup.h"

namespace vramscope::lower {

// Which script's lines run the encode (see above).
enum class VaeScript : uint8_t { kTextToImage, kDreamboothFlux };

struct VaeWeights {
  const ModelSpec* spec = nullptr;
  std::vector<Param> params;
  std::unordered_map<std::string, Param*> index;  // by parameter name
};

// The weights in the scripts' weight_dtype, allocated at setup (module "vae"),
// into `out` (whose index points into its own params). A VAE without the
// encoder's modules is an Error.
Status PlaceVaeWeights(Tape& tape, const ModelSpec& vae, const TrainingSetup& setup,
                       VaeWeights* out);

// The data loader's pixel_values: [b, in_channels, image, image] in fp32
// (the scripts' collate_fn calls .float()), made before the forward.
Var MakePixelValues(Tape& tape, const VaeWeights& vae, const TrainingSetup& setup, uint64_t image);

// One micro-batch's encode, from `pixels` (borrowed) to the scaled latents the
// step keeps (returned). `held` receives what else the script keeps until the
// step is over (FLUX's pixel_values in the VAE's dtype).
// `image` is the pixels' side.
Var VaeEncode(Tape& tape, VaeWeights& vae, const TrainingSetup& setup, VaeScript script,
              const Var& pixels, uint64_t image, std::vector<Var>* held);

}  // namespace vramscope::lower
