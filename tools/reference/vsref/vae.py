"""The frozen AutoencoderKL of a UNet or FLUX point with a VAE (Point.vae), as the scripts run it.

diffusers' training scripts (examples/text_to_image/train_text_to_image.py and
train_text_to_image_lora.py; examples/dreambooth/train_dreambooth_flux.py and
train_dreambooth_lora_flux.py, with diffusers 0.42.1 installed) keep the whole VAE on the
GPU, frozen (`vae.requires_grad_(False)`) and in weight_dtype (`vae.to(device,
dtype=weight_dtype)`), and encode each batch's fp32 pixel_values before the denoiser,
outside accelerate's autocast (which wraps only the prepared model's forward):

- text_to_image: `latents = vae.encode(pixel_values.to(weight_dtype)).latent_dist.sample()`,
  then `latents = latents * vae.config.scaling_factor`;
- dreambooth FLUX: `pixel_values = batch["pixel_values"].to(dtype=vae.dtype)` (a local
  until the next step), `model_input = vae.encode(pixel_values).latent_dist.sample()`, then
  `model_input = (model_input - shift_factor) * scaling_factor` and `.to(weight_dtype)`.

The recorder watches one module holding both the VAE and the denoiser, so that the VAE's
weights are parameters and its encode falls in the forward phase, where `vramscope
estimate --vae` puts it. The latents (and FLUX's cast pixels) live until the step is over
and the data loader's pixel_values are made each step, as a loop variable holds them. The
denoiser's own inputs stay the reference's stand-ins (vsref/unet.py, vsref/flux.py): the
noising arithmetic between the encode and the forward is not part of these points.
"""

import diffusers
import torch
import vramscope_trace

from .models import VAE_FAMILIES  # noqa: F401


def build_vae(config, dtype):
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL.from_config(config)
    vae.requires_grad_(False)
    # from_pretrained returns the model in eval mode; Dropout(p=0) allocates nothing either way.
    return vae.eval().to(dtype)


class VaeStep(torch.nn.Module):
    """The frozen VAE and the trained denoiser: forward encodes, then calls `denoise()`."""

    def __init__(self, vae, denoiser, weight_dtype, flux):
        super().__init__()
        self.vae = vae
        self.denoiser = denoiser
        self.weight_dtype = weight_dtype
        self.flux = flux

    def forward(self, pixel_values, hold, denoise):
        if self.flux:
            pixels = pixel_values.to(dtype=self.vae.dtype)
            hold.append(pixels)
            latents = self.vae.encode(pixels).latent_dist.sample()
            latents = (latents - self.vae.config.shift_factor) * self.vae.config.scaling_factor
            latents = latents.to(dtype=self.weight_dtype)
        else:
            latents = self.vae.encode(pixel_values.to(self.weight_dtype)).latent_dist.sample()
            latents = latents * self.vae.config.scaling_factor
        hold.append(latents)
        return denoise()


def record_steps(point, step_model, optimizer, inputs, image, loss_of, out_path, meta):
    """point.steps steps of the scripts' loop: fresh fp32 pixel_values, the forward (encode +
    denoiser; `loss_of(step_model, pixel_values, hold)` returns the loss and what else lives
    through backward), backward, optimizer step."""
    g = torch.Generator().manual_seed(2)
    channels = step_model.vae.config.in_channels
    with vramscope_trace.record(out_path, model=step_model, optimizer=optimizer, inputs=inputs,
                                meta=meta):
        for _ in range(point.steps):
            pixel_values = torch.randn(point.batch, channels, image, image, generator=g)
            optimizer.zero_grad(set_to_none=True)
            hold = []
            loss, *keep = loss_of(step_model, pixel_values, hold)
            loss.backward()
            del loss, keep
            optimizer.step()
            del pixel_values, hold
