"""CLIP (vsref's clip family, docs/fidelity.md): `vramscope estimate` counts the parameters
transformers makes, with transformers' names, for the published configs of the catalog
(CLIPModel, SD 1.5's CLIPTextModel, SDXL's CLIPTextModelWithProjection) and the reduced
ones the fidelity grid runs.

Runs under .venv/tf5 (transformers 5.24, whose module names the lowering uses).
"""

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from vsref import fidelity  # noqa: E402
from vsref.models import catalog_config, reduce_clip_config, reference_config  # noqa: E402

_CLASSES = {"CLIPModel": ("CLIPModel", "CLIPConfig"),
            "CLIPTextModel": ("CLIPTextModel", "CLIPTextConfig"),
            "CLIPTextModelWithProjection": ("CLIPTextModelWithProjection", "CLIPTextConfig"),
            "CLIPVisionModel": ("CLIPVisionModel", "CLIPVisionConfig"),
            "CLIPVisionModelWithProjection": ("CLIPVisionModelWithProjection", "CLIPVisionConfig")}


def _meta_model(config):
    model_class, config_class = _CLASSES[config["architectures"][0]]
    kwargs = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    cfg = getattr(transformers, config_class)(**kwargs)
    with torch.device("meta"):
        return getattr(transformers, model_class)(cfg)


def _estimated_parameters(path):
    """The parameter count `vramscope estimate` reads from the config. A tower alone has no
    training step: estimated as a frozen --text-encoder of a diffusion UNet (whose report
    counts the UNet's parameters), so its count is checked with `estimate` on a CLIPModel
    only; the towers' names and shapes are checked in src/ingest/params_test.cc."""
    proc = subprocess.run([fidelity.VRAMSCOPE, "estimate", str(path), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["model"]["parameters"]


def _vision_only(config):
    c = dict(config["vision_config"], architectures=["CLIPVisionModelWithProjection"],
             projection_dim=config["projection_dim"])
    return c


_CONFIGS = {
    "clip-vit-large-patch14": catalog_config("clip-vit-large-patch14"),
    "sd-1.5-text-encoder": catalog_config("sd-1.5-text-encoder"),
    "sdxl-text-encoder-2": catalog_config("sdxl-text-encoder-2"),
    "reduced": reference_config("clip"),
    "reduced-text": reduce_clip_config(catalog_config("sdxl-text-encoder-2")),
    "vision-with-projection": _vision_only(catalog_config("clip-vit-large-patch14")),
}


@pytest.mark.parametrize("name", ["clip-vit-large-patch14", "reduced"])
def test_estimate_counts_the_parameters_transformers_makes(name, tmp_path):
    if not transformers.__version__.startswith("5."):
        pytest.skip("the parameter names are transformers 5.x's")
    config = _CONFIGS[name]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    model = _meta_model(config)
    assert _estimated_parameters(path) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(_CONFIGS))
def test_params_test_names_are_transformers(name):
    """The names and shapes src/ingest/params_test.cc expects for the one-layer CLIP
    configs are those transformers 5.24 makes (the file is written from this list)."""
    if not transformers.__version__.startswith("5."):
        pytest.skip("the parameter names are transformers 5.x's")
    config = _CONFIGS[name]
    if "model_type" not in config:
        config = dict(config, model_type="clip_vision_model")
    model = _meta_model(config)
    names = [n for n, _ in model.named_parameters()]
    # Every tensor of a layer appears once per layer, in CLIPEncoderLayer's order.
    layer0 = [n.split("layers.0.", 1)[1] for n in names if "encoder.layers.0." in n]
    assert layer0[:8] == ["self_attn.k_proj.weight", "self_attn.k_proj.bias",
                          "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                          "self_attn.q_proj.weight", "self_attn.q_proj.bias",
                          "self_attn.out_proj.weight", "self_attn.out_proj.bias"]
