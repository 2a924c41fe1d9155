"""The UNet points' reference side (vsref/unet.py, docs/fidelity.md): the reduced diffusers
configs build and run, `vramscope estimate` counts the parameters diffusers makes, and the
published SD 1.5 / SDXL base UNets have the parameter counts diffusers gives them.

Runs under .venv/tf5 (diffusers 0.42.1, scripts/test.sh's fidelity step); skipped where
diffusers is not installed (.venv/tf4, the system Python).
"""

import json
import os
import subprocess
import sys

import pytest

diffusers = pytest.importorskip("diffusers")
torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from vsref import fidelity  # noqa: E402
from vsref.grid import unet_points  # noqa: E402
from vsref.models import UNET_FAMILIES, reference_config  # noqa: E402

# The published unet/config.json of stable-diffusion-v1-5 and of stable-diffusion-xl-base-1.0
# (the keys that select code paths and sizes; the rest are diffusers' defaults).
SD15 = {
    "_class_name": "UNet2DConditionModel", "act_fn": "silu", "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280], "center_input_sample": False,
    "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                         "DownBlock2D"],
    "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4,
    "layers_per_block": 2, "mid_block_scale_factor": 1, "norm_eps": 1e-05,
    "norm_num_groups": 32, "out_channels": 4, "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                       "CrossAttnUpBlock2D"],
}
SDXL = {
    "_class_name": "UNet2DConditionModel", "sample_size": 128, "in_channels": 4,
    "out_channels": 4, "layers_per_block": 2, "block_out_channels": [320, 640, 1280],
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "attention_head_dim": [5, 10, 20], "transformer_layers_per_block": [1, 2, 10],
    "use_linear_projection": True, "cross_attention_dim": 2048,
    "addition_embed_type": "text_time", "addition_time_embed_dim": 256,
    "projection_class_embeddings_input_dim": 2816, "norm_num_groups": 32, "norm_eps": 1e-05,
    "act_fn": "silu", "flip_sin_to_cos": True, "freq_shift": 0,
    "mid_block_type": "UNetMidBlock2DCrossAttn",
}


def _build(config):
    torch.manual_seed(0)
    return diffusers.UNet2DConditionModel.from_config(config)


def _parameters(model):
    return sum(p.numel() for p in model.parameters())


def _a_point(family):
    return next(p for p in unet_points() if p.family == family)


@pytest.mark.parametrize("family", sorted(UNET_FAMILIES))
def test_reduced_config_builds_and_runs(family):
    from vsref import unet

    point = _a_point(family)
    config = reference_config(family)
    model = unet.build_unet(point, config)
    pred = unet.predict(point, model, unet.make_batch(point, config))
    assert pred.shape == (point.batch, config["out_channels"], config["sample_size"],
                          config["sample_size"])


@pytest.mark.parametrize("family", sorted(UNET_FAMILIES))
def test_estimate_counts_the_parameters_diffusers_makes(family, tmp_path):
    if not os.path.exists(fidelity.VRAMSCOPE):
        pytest.fail(f"{fidelity.VRAMSCOPE} is missing: run scripts/build.sh")
    config = reference_config(family)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    proc = subprocess.run([fidelity.VRAMSCOPE, "estimate", str(path), "--json"],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode == 2:
        # Until the lowering supports UNet2DConditionModel (C++ under way on this branch),
        # estimate rejects the config as a usage error. Remove this skip when it lands.
        pytest.skip(f"estimate does not read UNet configs yet: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"]["parameters"] == _parameters(_build(config))


@pytest.mark.parametrize("config, parameters", [(SD15, 859_520_964), (SDXL, 2_567_463_684)],
                         ids=["sd15", "sdxl-base"])
def test_published_unet_parameter_counts(config, parameters):
    # On the meta device: no memory, no initialization, exact shapes.
    with torch.device("meta"):
        model = diffusers.UNet2DConditionModel.from_config(config)
    assert _parameters(model) == parameters
