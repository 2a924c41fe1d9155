"""Runs a FLUX grid point: the real diffusers 0.42.1 FluxTransformer2DModel trained on CPU.

Called by runner.py for the families of models.FLUX_FAMILIES, inside .venv/tf5. The step is
that of examples/dreambooth/train_dreambooth_flux.py (full fine-tuning) and
train_dreambooth_lora_flux.py (LoRA), diffusers 0.42.1, with the frozen VAE and text
encoders replaced by tensors of their output shapes:

- latents [b, c, h, w] (c = in_channels / 4) are noised by flow matching,
  noisy = (1 - sigma) * latents + sigma * noise, packed 2 x 2 into (h/2)·(w/2) tokens of
  4c features (FluxPipeline._pack_latents);
- img_ids [(h/2)·(w/2), 3] hold each token's row and column (FluxPipeline.
  _prepare_latent_image_ids), txt_ids [text_len, 3] are zeros;
- timestep = t / 1000 in fp32 (the scheduler's timesteps), guidance (only with
  guidance_embeds) the guidance scale, a [1] fp32 tensor expanded to the batch,
  pooled_projections [b, pooled_projection_dim], encoder_hidden_states [b, text_len,
  joint_attention_dim], all but the timestep and guidance in the scripts' weight_dtype;
- the prediction is unpacked and the loss is the weighted flow-matching MSE against
  noise - latents (weighting = ones_like(sigmas): the scripts' default "none" scheme).

The knobs, as the scripts apply them: LoRA is `transformer.requires_grad_(False)`, the
dtype cast, checkpointing, then `add_adapter(LoraConfig(r, lora_alpha=r,
init_lora_weights="gaussian", target_modules=[to_k, to_q, to_v, to_out.0]))`;
checkpointing is `enable_gradient_checkpointing()` (use_reentrant=False); bf16-mixed is
accelerate's autocast around forward with its output converted to fp32, the full script
keeping the transformer in fp32 and the LoRA script casting it to bf16 first.

A family of models.TEXT_ENCODERS (flux_dev_te) runs its frozen CLIPTextModel and
T5EncoderModel each step instead of the pooled_projections and encoder_hidden_states
tensors, as the scripts do with per-image captions (`compute_text_embeddings` under
torch.no_grad(): encode_prompt's _encode_prompt_with_clip, then _encode_prompt_with_t5).
"""

import diffusers
import torch
import vramscope_trace

from . import text_encoders
from .knobs import UNET_CKPTS
from .models import TEXT_ENCODERS, FLUX_FAMILIES, FLUX_LATENT_SIDE, FLUX_TEXT_LEN  # noqa: F401
from .runner import make_optimizer

# The LoRA script's default --lora_layers (train_dreambooth_lora_flux.py).
LORA_MODULES = ["to_k", "to_q", "to_v", "to_out.0"]
# The lowering's --lora-targets names for them.
_LORA_TARGETS = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0"}


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
    latents = torch.randn(batch, c, side, side, generator=g).to(dtype)
    noise = torch.randn(latents.shape, generator=g).to(dtype)
    sigma = torch.rand(batch, generator=g).to(dtype).view(batch, 1, 1, 1)
    out = {
        "hidden_states": pack((1 - sigma) * latents + sigma * noise),
        "timestep": torch.rand(batch, generator=g),
        "pooled_projections": torch.randn(batch, config["pooled_projection_dim"],
                                          generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(batch, text_len, config["joint_attention_dim"],
                                             generator=g).to(dtype),
        "txt_ids": torch.zeros(text_len, 3, dtype=dtype),
        "img_ids": image_ids(side, side, dtype),
        "target": noise - latents,
        "weighting": torch.ones_like(sigma),
    }
    if config.get("guidance_embeds"):
        out["guidance"] = torch.full((1,), 3.5, dtype=torch.float32).expand(batch)
    return out


def predict(model, batch, mixed=False):
    inputs = {k: v for k, v in batch.items() if k not in ("target", "weighting")}
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
        pred = model(**inputs, return_dict=False)[0]
    # accelerate's convert_outputs_to_fp32, outside the autocast.
    return pred.float() if mixed else pred


def loss_of(model, batch, side, mixed=False):
    """The scripts' flow-matching loss on the unpacked prediction."""
    pred = unpack(predict(model, batch, mixed), side, side)
    target = batch["target"]
    return torch.mean((batch["weighting"].float() * (pred.float() - target.float()) ** 2)
                      .reshape(target.shape[0], -1), 1).mean()


def _encode_with_clip(encoder, batch_size):
    """_encode_prompt_with_clip: the prompt padded to the tokenizer's length (here the
    reduced encoder's max_position_embeddings), pooler_output only, then repeat (a copy)."""
    ids = torch.randint(2, encoder.config.vocab_size,
                        (batch_size, encoder.config.max_position_embeddings))
    prompt_embeds = encoder(ids, output_hidden_states=False)
    prompt_embeds = prompt_embeds.pooler_output
    prompt_embeds = prompt_embeds.to(dtype=encoder.dtype)
    prompt_embeds = prompt_embeds.repeat(1, 1, 1)
    return prompt_embeds.view(batch_size, -1)


def _encode_with_t5(encoder, batch_size, text_len):
    """_encode_prompt_with_t5: `text_encoder(ids)[0]`, then repeat (a copy)."""
    ids = torch.randint(2, encoder.config.vocab_size, (batch_size, text_len))
    prompt_embeds = encoder(ids)[0]
    prompt_embeds = prompt_embeds.to(dtype=encoder.dtype)
    _, seq_len, _ = prompt_embeds.shape
    prompt_embeds = prompt_embeds.repeat(1, 1, 1)
    return prompt_embeds.view(batch_size, seq_len, -1)


def encode_prompt(encoders, batch, text_len):
    """compute_text_embeddings: CLIP's pooled state, then T5's states, without a graph. The
    loop's variables (here the batch's entries) are rebound when it returns, so the
    previous step's states live until both new ones exist."""
    clip, t5 = encoders
    b = batch["hidden_states"].shape[0]
    with torch.no_grad():
        pooled = _encode_with_clip(clip, b)
        states = _encode_with_t5(t5, b, text_len)
    batch["encoder_hidden_states"], batch["pooled_projections"] = states, pooled


def _drop_text_states(batch):
    for key in ("pooled_projections", "encoder_hidden_states"):
        batch.pop(key, None)


def _dtype(point):
    # As for the UNet (vsref/unet.py): bf16 weights under "bf16", and under "bf16-mixed" for
    # LoRA (the LoRA script casts the transformer to weight_dtype before add_adapter); the
    # full script keeps the trained transformer in fp32.
    if point.precision == "bf16" or (point.precision == "bf16-mixed" and point.finetune == "lora"):
        return torch.bfloat16
    return torch.float32


def apply_knobs(point, model):
    if point.finetune == "lora":
        import peft

        model.requires_grad_(False)
    if point.ckpt == "full":
        model.enable_gradient_checkpointing()
    if point.finetune == "lora":
        targets = [_LORA_TARGETS[key] for key in point.lora_targets.split(",")]
        model.add_adapter(peft.LoraConfig(r=point.lora_rank, lora_alpha=point.lora_rank,
                                          lora_dropout=point.lora_dropout,
                                          init_lora_weights="gaussian",
                                          target_modules=targets))
    model.train()
    return model


def run(point, config, out_path, latent_side=FLUX_LATENT_SIDE):
    if point.ckpt not in UNET_CKPTS or point.attn != "sdpa" or point.gpus != 1:
        raise ValueError(f"{point.name()}: a FLUX point takes ckpt none/full, attn sdpa, 1 GPU")
    if point.vae and point.family in TEXT_ENCODERS:
        raise ValueError(f"{point.name()}: text encoders and a VAE are not run together")
    model = apply_knobs(point, build(config, _dtype(point)))
    optimizer = make_optimizer(point, model)
    batch_dtype = torch.float32 if point.precision == "fp32" else torch.bfloat16
    batch = make_batch(config, point.batch, latent_side, point.seq, batch_dtype)
    mixed = point.precision == "bf16-mixed"
    meta = [("reference", point.name()), ("diffusers", diffusers.__version__),
            ("torch", torch.__version__)]
    if point.vae:
        # The frozen VAE encodes fresh pixels first (vsref/vae.py), in weight_dtype.
        from . import vae as vsvae
        from .models import VAE_FAMILIES, VAE_SCALE

        vae = vsvae.build_vae(VAE_FAMILIES[point.vae], batch_dtype)
        step = vsvae.VaeStep(vae, model, batch_dtype, flux=True)

        def step_loss(m, pixel_values, hold):
            return (m(pixel_values, hold, lambda: loss_of(model, batch, latent_side, mixed)),)

        vsvae.record_steps(point, step, optimizer, batch, latent_side * VAE_SCALE, step_loss,
                           out_path, meta)
        return
    encoders = text_encoders.build_text_encoders(point.family, batch_dtype)
    inputs = batch
    if encoders:
        # The text states come from the encoders each step; their weights exist before
        # the steps (setup allocations).
        _drop_text_states(batch)
        inputs = {"batch": batch, "text_encoders": text_encoders.encoder_weights(encoders)}
    with vramscope_trace.record(out_path, model=model, optimizer=optimizer, inputs=inputs,
                                meta=meta):
        for _ in range(point.steps):
            optimizer.zero_grad(set_to_none=True)
            if encoders:
                encode_prompt(encoders, batch, point.seq)
            loss = loss_of(model, batch, latent_side, mixed)
            loss.backward()
            del loss
            optimizer.step()
