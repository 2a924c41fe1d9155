"""Runs a UNet grid point: a real diffusers UNet2DConditionModel trained on CPU, recorded.

Called by runner.py for the families of models.UNET_FAMILIES, inside .venv/tf5 (the only
environment with diffusers, 0.42.1). The knobs follow diffusers' own training scripts
(examples/text_to_image/train_text_to_image.py for full fine-tuning,
train_text_to_image_lora.py for LoRA):

- checkpointing: `unet.enable_gradient_checkpointing()`, which always passes
  use_reentrant=False to torch.utils.checkpoint (diffusers' ModelMixin);
- LoRA: `unet.requires_grad_(False)`, then `unet.add_adapter(LoraConfig(r, lora_alpha=r,
  init_lora_weights="gaussian", target_modules=[to_k, to_q, to_v, to_out.0]))`, after the
  dtype cast and before checkpointing is turned on, in the LoRA script's order;
- attention: the default processor (AttnProcessor2_0, torch SDPA);
- bf16-mixed: accelerate's `prepare(unet)` wraps only unet.forward in autocast and converts
  its outputs to fp32 (convert_outputs_to_fp32); the scripts' mse_loss runs after it,
  outside autocast, and so does it here.

The batch stands in for what the scripts compute from the VAE and the text encoder (which
train nothing): noisy latents, timesteps, text hidden states, the noise as target, and for
"text_time" (SDXL) the pooled text embeddings and the six time ids. A family of
models.TEXT_ENCODERS runs its frozen CLIPTextModel instead (train_text_to_image.py:
`text_encoder.requires_grad_(False)`, `.to(device, dtype=weight_dtype)`, then each step
`text_encoder(batch["input_ids"], return_dict=False)[0]` outside the UNet's autocast).
"""

import diffusers
import torch
import torch.nn.functional as F
import vramscope_trace

from .knobs import UNET_CKPTS
from . import text_encoders
from .models import TEXT_ENCODERS
from .runner import make_optimizer

# The lowering's --lora-targets names for diffusers' attention projections.
_LORA_MODULES = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0"}
# SDXL's time ids: original size, crop top-left and target size, two numbers each.
_TIME_IDS = 6


def _dtype(point):
    # bf16 weights for "bf16"; fp32 weights for "fp32" and, full fine-tuning, "bf16-mixed"
    # (train_text_to_image.py keeps the UNet in fp32 under accelerate's autocast). The LoRA
    # script casts the UNet to weight_dtype (bf16 under bf16 mixed precision) before
    # add_adapter and still runs under autocast (train_text_to_image_lora.py).
    if point.precision == "bf16" or (point.precision == "bf16-mixed" and point.finetune == "lora"):
        return torch.bfloat16
    return torch.float32


def _check(point):
    """diffusers offers non-reentrant checkpointing and SDPA only (vsref/knobs.py)."""
    if point.ckpt not in UNET_CKPTS or point.attn != "sdpa" or point.gpus != 1:
        raise ValueError(f"{point.name()}: a UNet point takes ckpt none/full, attn sdpa, 1 GPU")


def build_unet(point, config):
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel.from_config(config)
    return unet.to(_dtype(point))


def _lora_config(point):
    import peft

    targets = [_LORA_MODULES[key] for key in point.lora_targets.split(",")]
    return peft.LoraConfig(r=point.lora_rank, lora_alpha=point.lora_rank,
                           lora_dropout=point.lora_dropout,
                           init_lora_weights="gaussian", target_modules=targets)


def apply_knobs(point, unet):
    if point.finetune == "lora":
        # add_adapter injects in place: the UNet stays the model that is called. PEFT keeps
        # the adapters in the base weights' dtype here (bf16 under "bf16"); only the
        # scripts' fp16 path upcasts them (cast_training_params), not in the grid.
        unet.requires_grad_(False)
        unet.add_adapter(_lora_config(point))
    if point.ckpt == "full":
        unet.enable_gradient_checkpointing()
    unet.train()
    return unet


def _batch_dtype(point):
    # The scripts' latents, noise and text states come from the frozen VAE and text
    # encoder in their weight_dtype: bf16 under "bf16" and under mixed precision.
    return torch.float32 if point.precision == "fp32" else torch.bfloat16


def make_batch(point, config):
    """The UNet's inputs and the target in the scripts' weight_dtype (_batch_dtype); the
    timesteps int64."""
    g = torch.Generator().manual_seed(1)
    dtype, b, size = _batch_dtype(point), point.batch, config["sample_size"]
    batch = {
        "sample": torch.randn(b, config["in_channels"], size, size, generator=g, dtype=dtype),
        "timestep": torch.randint(0, 1000, (b,), generator=g, dtype=torch.int64),
        "encoder_hidden_states": torch.randn(b, point.seq, config["cross_attention_dim"],
                                             generator=g, dtype=dtype),
        "added_cond_kwargs": _added_cond(point, config, g, dtype),
    }
    batch["target"] = torch.randn(batch["sample"].shape, generator=g, dtype=dtype)
    return batch


def _added_cond(point, config, g, dtype):
    if config.get("addition_embed_type") != "text_time":
        return {}
    # text_embeds' width is what the projection's input has left after the time ids.
    time_width = _TIME_IDS * config["addition_time_embed_dim"]
    text = config["projection_class_embeddings_input_dim"] - time_width
    return {"text_embeds": torch.randn(point.batch, text, generator=g, dtype=dtype),
            "time_ids": torch.randn(point.batch, _TIME_IDS, generator=g, dtype=dtype)}


def predict(point, unet, batch):
    mixed = point.precision == "bf16-mixed"
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
        pred = unet(batch["sample"], batch["timestep"], batch["encoder_hidden_states"],
                    added_cond_kwargs=batch["added_cond_kwargs"], return_dict=False)[0]
    # accelerate's convert_outputs_to_fp32, outside the autocast: the bf16 output is
    # dropped as the fp32 copy replaces it.
    return pred.float() if mixed else pred


def build_text_encoders(point):
    """The family's frozen text encoders in weight_dtype, in the pipeline's order."""
    return text_encoders.build_text_encoders(point.family, _batch_dtype(point))


def encode_prompt(point, encoders, batch):
    """SD 1.5: `text_encoder(input_ids, return_dict=False)[0]`. SDXL (two encoders,
    train_text_to_image_lora_sdxl.py encode_prompt): each encoder with
    output_hidden_states=True, `pooled = out[0]`, `hidden_states[-2]` kept, the two
    concatenated; the last encoder's pooled projection is text_embeds."""
    ids = torch.randint(2, TEXT_ENCODERS[point.family][0]["vocab_size"],
                        (point.batch, point.seq))
    if len(encoders) == 1:
        batch["encoder_hidden_states"] = encoders[0](ids, return_dict=False)[0]
        return
    states = []
    for encoder in encoders:
        out = encoder(ids, output_hidden_states=True, return_dict=False)
        pooled = out[0]
        states.append(out[-1][-2])
        del out
    batch["encoder_hidden_states"] = torch.concat(states, dim=-1)
    del states
    batch["added_cond_kwargs"]["text_embeds"] = pooled
def _run_with_vae(point, config, unet, optimizer, batch, out_path, meta):
    """The step after the frozen VAE's encode of fresh pixels (vsref/vae.py), in the
    scripts' weight_dtype; the prediction lives through backward as below."""
    from . import vae as vsvae
    from .models import VAE_FAMILIES, VAE_SCALE

    dtype = _batch_dtype(point)
    step = vsvae.VaeStep(vsvae.build_vae(VAE_FAMILIES[point.vae], dtype), unet, dtype, flux=False)

    def loss_of(model, pixel_values, hold):
        pred = model(pixel_values, hold, lambda: predict(point, unet, batch))
        return F.mse_loss(pred.float(), batch["target"].float(), reduction="mean"), pred

    vsvae.record_steps(point, step, optimizer, batch, config["sample_size"] * VAE_SCALE, loss_of,
                       out_path, meta)


def run(point, config, out_path):
    _check(point)
    unet = apply_knobs(point, build_unet(point, config))
    encoders = build_text_encoders(point)
    optimizer = make_optimizer(point, unet)
    batch = make_batch(point, config)
    inputs = batch
    if encoders:
        # The text states come from the encoders each step; their weights and buffers
        # exist before the steps (setup allocations).
        del batch["encoder_hidden_states"]
        batch["added_cond_kwargs"].pop("text_embeds", None)
        inputs = {"batch": batch, "text_encoders": text_encoders.encoder_weights(encoders)}
    meta = [("reference", point.name()), ("diffusers", diffusers.__version__),
            ("torch", torch.__version__)]
    if point.vae:
        _run_with_vae(point, config, unet, optimizer, batch, out_path, meta)
        return
    with vramscope_trace.record(out_path, model=unet, optimizer=optimizer, inputs=inputs,
                                meta=meta):
        for _ in range(point.steps):
            optimizer.zero_grad(set_to_none=True)
            if encoders:
                encode_prompt(point, encoders, batch)
            pred = predict(point, unet, batch)
            loss = F.mse_loss(pred.float(), batch["target"].float(), reduction="mean")
            loss.backward()
            # The prediction lives through backward; the scripts keep model_pred longer
            # still (until the next step replaces it), the grid drops it before step() as
            # the transformers points drop their output.
            del loss, pred
            if encoders:
                del batch["encoder_hidden_states"]
                batch["added_cond_kwargs"].pop("text_embeds", None)
            optimizer.step()
