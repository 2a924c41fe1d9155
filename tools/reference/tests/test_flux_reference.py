"""The FLUX transformer's reference side: the catalog's published FLUX.1-dev
transformer/config.json, built by diffusers 0.42.1 on the meta device, has the
parameters `vramscope models` gives it (src/ingest/family_flux.cc), and so do
reduced configs exercising the optional paths; `vramscope estimate` lowers them
(src/lower/flux.cc) and refuses by name what it does not model. The fidelity grid's
FLUX points (vsref/grid.py flux_points) compare the lowering with vsref/flux.py's
recorded steps.

Runs under .venv/tf5 (diffusers 0.42.1); skipped where diffusers is not installed.
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

CATALOG = os.path.normpath(os.path.join(HERE, "..", "..", "..", "data", "models"))
ALIAS = "flux.1-dev-transformer"


def _require_binary():
    if not os.path.exists(fidelity.VRAMSCOPE):
        pytest.fail(f"{fidelity.VRAMSCOPE} is missing: run scripts/build.sh")


def _catalog_config():
    with open(os.path.join(CATALOG, ALIAS + ".json"), encoding="utf-8") as f:
        config = json.load(f)
    meta = config.pop("_vramscope")
    return config, meta


def _diffusers_parameters(config):
    with torch.device("meta"):
        model = diffusers.FluxTransformer2DModel.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_catalog_flux_has_the_parameters_diffusers_makes():
    _require_binary()
    config, meta = _catalog_config()
    parameters = _diffusers_parameters(config)
    assert parameters == 11_901_408_320 == meta["reference_parameters"]
    proc = subprocess.run([fidelity.VRAMSCOPE, "models", "--json"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = {row["alias"]: row for row in json.loads(proc.stdout)}
    assert rows[ALIAS]["parameters"] == parameters
    assert rows[ALIAS]["layers"] == 19 + 38


@pytest.mark.parametrize("config", [
    {"guidance_embeds": False},
    {"patch_size": 2, "in_channels": 16, "out_channels": 8, "num_layers": 2,
     "num_single_layers": 3, "attention_head_dim": 16, "num_attention_heads": 2,
     "joint_attention_dim": 48, "pooled_projection_dim": 24, "axes_dims_rope": [4, 6, 6]},
], ids=["schnell", "reduced"])
def test_estimate_lowers_flux_and_counts_diffusers_parameters(config, tmp_path):
    """The parameter counts of these configs are checked in C++
    (src/ingest/params_test.cc FluxParamsTest); here diffusers builds them and
    vramscope estimates their training step with the same count. A patch size
    other than 1 is refused by name (FluxPipeline packs 2 x 2 latents)."""
    _require_binary()
    full = {"_class_name": "FluxTransformer2DModel", **config}
    parameters = _diffusers_parameters(full)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(full), encoding="utf-8")
    proc = subprocess.run([fidelity.VRAMSCOPE, "estimate", str(path), "--image-size", "64",
                           "--text-len", "8", "--json"], capture_output=True, text=True,
                          timeout=60)
    if full.get("patch_size", 1) != 1:
        assert proc.returncode == 2 and "patch_size" in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"]["parameters"] == parameters


def test_flux_refusals_name_the_flag(tmp_path):
    """What the lowering does not model exits 2 naming it (lower.cc ValidateFlux)."""
    _require_binary()
    for args, name in [(["--attn", "eager"], "--attn"), (["--grad-ckpt", "reentrant"], "reentrant"),
                       (["--image-size", "520"], "--image-size"), (["--gpus", "2"], "one GPU")]:
        proc = subprocess.run([fidelity.VRAMSCOPE, "estimate", ALIAS, *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2 and name in proc.stderr, (args, proc.stderr)


def test_reduced_flux_training_step_runs():
    """vsref/flux.py's step (packed latents, ids, guidance, flow-matching MSE) runs
    forward and backward on the real diffusers model."""
    from vsref import flux

    config = flux.FLUX_FAMILIES["flux_dev"]
    model = flux.build(config)
    batch = flux.make_batch(config, batch=2, latent_side=8, text_len=8, dtype=torch.float32)
    assert batch["hidden_states"].shape == (2, 16, config["in_channels"])
    latents = torch.randn(2, 4, 8, 8)
    assert torch.equal(flux.unpack(flux.pack(latents), 8, 8), latents)
    loss = flux.loss_of(model, batch, 8)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
