"""The frozen text encoders of a diffusion grid point (models.TEXT_ENCODERS), built as the
diffusers 0.42.1 training scripts hold them: `requires_grad_(False)` and
`.to(device, dtype=weight_dtype)`, in eval mode as `from_pretrained` returns them (T5's
dropout is then off; CLIP has none), with transformers' default attention (SDPA).
Used by vsref/unet.py and vsref/flux.py inside .venv/tf5."""

import torch

from .models import TEXT_ENCODERS


def build_text_encoders(family, dtype):
    """The family's encoders in the pipeline's order; [] for a family without them."""
    if family not in TEXT_ENCODERS:
        return []
    import transformers

    encoders = []
    for i, config in enumerate(TEXT_ENCODERS[family]):
        config = dict(config)
        cls = getattr(transformers, config.pop("architectures")[0])
        model_type = config.pop("model_type")
        config_cls = transformers.T5Config if model_type == "t5" else transformers.CLIPTextConfig
        torch.manual_seed(i)
        encoder = cls(config_cls(**config))
        encoder.requires_grad_(False)
        encoder.eval()
        encoders.append(encoder.to(dtype))
    return encoders


def encoder_weights(encoders):
    """Every encoder's parameters and buffers: setup allocations of the trace."""
    return [t for e in encoders for t in (*e.parameters(), *e.buffers())]
