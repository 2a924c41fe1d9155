"""The FLUX transformer's reference training step (groundwork for issue 21's lowering).

Not in the fidelity grid yet: vramscope does not lower FluxTransformer2DModel, so no point
can be compared. This drives the real diffusers 0.42.1 FluxTransformer2DModel through the
step of examples/dreambooth/train_dreambooth_lora_flux.py (and train_dreambooth_flux.py),
with the frozen VAE and text encoders replaced by tensors of their output shapes:

- latents [b, c, h, w] (c = in_channels / 4) are noised by flow matching,
  noisy = (1 - sigma) * latents + sigma * noise, packed 2 x 2 into (h/2)·(w/2) tokens of
  4c features (FluxPipeline._pack_latents);
- img_ids [(h/2)·(w/2), 3] hold each token's row and column (FluxPipeline.
  _prepare_latent_image_ids), txt_ids [text_len, 3] are zeros;
- timestep = t / 1000, guidance (only with guidance_embeds) the guidance scale per sample,
  pooled_projections [b, pooled_projection_dim], encoder_hidden_states [b, text_len,
  joint_attention_dim];
- the prediction is unpacked and the loss is the weighted flow-matching MSE against
  noise - latents (weighting 1: the scripts' default "none" scheme).
"""

import diffusers
import torch
import vramscope_trace

from .runner import make_optimizer

# The LoRA script's default --lora_layers (train_dreambooth_lora_flux.py).
LORA_MODULES = ["to_k", "to_q", "to_v", "to_out.0"]

# A reduced FLUX.1-dev layout (guidance embedding, two double and two single blocks,
# two heads of 16 features rotated by axes 4 + 6 + 6).
FLUX_FAMILIES = {
    "flux_dev": {
        "_class_name": "FluxTransformer2DModel", "patch_size": 1, "in_channels": 16,
        "num_layers": 2, "num_single_layers": 2, "attention_head_dim": 16,
        "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 24,
        "guidance_embeds": True, "axes_dims_rope": [4, 6, 6],
    },
}


def build(config, dtype=torch.float32):
    torch.manual_seed(0)
    return diffusers.FluxTransformer2DModel.from_config(config).to(dtype)


def pack(latents):
    """[b, c, h, w] -> [b, (h/2)(w/2), 4c], as FluxPipeline._pack_latents."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens, h, w):
    """The inverse of pack for a latent of h x w."""
    b, _, features = tokens.shape
    x = tokens.view(b, h // 2, w // 2, features // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, features // 4, h, w)


def image_ids(h, w, dtype):
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 1] += torch.arange(h // 2)[:, None]
    ids[..., 2] += torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3).to(dtype)


def make_batch(config, batch, latent_side, text_len, dtype):
    g = torch.Generator().manual_seed(1)
    c, side = config["in_channels"] // 4, latent_side
    latents = torch.randn(batch, c, side, side, generator=g, dtype=dtype)
    noise = torch.randn(latents.shape, generator=g, dtype=dtype)
    sigma = torch.rand(batch, generator=g).to(dtype).view(batch, 1, 1, 1)
    out = {
        "hidden_states": pack((1 - sigma) * latents + sigma * noise),
        "timestep": (sigma.flatten() * 1000).to(dtype) / 1000,
        "pooled_projections": torch.randn(batch, config["pooled_projection_dim"], generator=g,
                                          dtype=dtype),
        "encoder_hidden_states": torch.randn(batch, text_len, config["joint_attention_dim"],
                                             generator=g, dtype=dtype),
        "txt_ids": torch.zeros(text_len, 3, dtype=dtype),
        "img_ids": image_ids(side, side, dtype),
        "target": noise - latents,
    }
    if config.get("guidance_embeds"):
        out["guidance"] = torch.full((batch,), 3.5, dtype=torch.float32)
    return out


def loss_of(model, batch, side):
    inputs = {k: v for k, v in batch.items() if k != "target"}
    pred = model(**inputs, return_dict=False)[0]
    pred = unpack(pred, side, side)
    return torch.mean(((pred.float() - batch["target"].float()) ** 2).reshape(pred.shape[0], -1),
                      1).mean()


def run(point, config, out_path, latent_side=8, text_len=8):
    """One recorded run (fp32, full fine-tuning): not called by the grid yet."""
    model = build(config)
    model.train()
    optimizer = make_optimizer(point, model)
    batch = make_batch(config, point.batch, latent_side, text_len, torch.float32)
    meta = [("reference", point.name()), ("diffusers", diffusers.__version__),
            ("torch", torch.__version__)]
    with vramscope_trace.record(out_path, model=model, optimizer=optimizer, inputs=batch,
                                meta=meta):
        for _ in range(point.steps):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(model, batch, latent_side)
            loss.backward()
            del loss
            optimizer.step()
