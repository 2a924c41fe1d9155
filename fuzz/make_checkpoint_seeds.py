"""Writes fuzz/corpus/checkpoint_header: real checkpoints of small T5, CLIP, UNet,
FLUX and VAE models as transformers 5.24 and diffusers 0.42 save them
(save_pretrained with safetensors), each as the fuzz_checkpoint_header input: the
config.json on one line, then the safetensors header (the data is dropped: vramscope
reads headers only).

    .venv/tf5/bin/python fuzz/make_checkpoint_seeds.py
"""
import json
import pathlib
import struct
import tempfile

import torch

OUT = pathlib.Path(__file__).resolve().parent / "corpus" / "checkpoint_header"


def transformers_models():
    from transformers import (CLIPConfig, CLIPModel, CLIPTextConfig, CLIPTextModel,
                              T5Config, T5EncoderModel, T5ForConditionalGeneration)
    t5 = T5Config(d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2, vocab_size=64,
                  relative_attention_num_buckets=8)
    gated = T5Config(d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2, vocab_size=64,
                     feed_forward_proj="gated-gelu", relative_attention_num_buckets=8)
    text = CLIPTextConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, vocab_size=64, max_position_embeddings=77,
                          projection_dim=16)
    clip = CLIPConfig(text_config=text.to_dict(),
                      vision_config=dict(hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=2, num_attention_heads=2,
                                         image_size=32, patch_size=8),
                      projection_dim=16)
    yield "t5", T5ForConditionalGeneration(t5)
    yield "t5_encoder", T5EncoderModel(gated)
    yield "clip_text", CLIPTextModel(text)
    yield "clip", CLIPModel(clip)


def diffusers_models():
    from diffusers import AutoencoderKL, FluxTransformer2DModel, UNet2DConditionModel
    yield "unet", UNet2DConditionModel(
        block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), norm_num_groups=8,
        cross_attention_dim=32, sample_size=8, layers_per_block=1, attention_head_dim=8)
    yield "flux", FluxTransformer2DModel(
        num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6),
        in_channels=16)
    yield "vae", AutoencoderKL(
        block_out_channels=(32, 32, 64, 64), down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=8, layers_per_block=1)


def seed(model):
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        config = json.loads((pathlib.Path(d) / "config.json").read_text())
        weights = next(pathlib.Path(d).glob("*.safetensors")).read_bytes()
    n = struct.unpack("<Q", weights[:8])[0]
    return json.dumps(config).encode() + b"\n" + weights[8:8 + n]


def main():
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    for models in (transformers_models(), diffusers_models()):
        for name, model in models:
            (OUT / name).write_bytes(seed(model))
            print(name, (OUT / name).stat().st_size)


if __name__ == "__main__":
    main()
