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

CATALOG = os.path.normpath(os.path.join(HERE, "..", "..", "..", "data", "models"))


def _catalog_config(alias):
    """A catalog UNet's published unet/config.json, without vramscope's own block."""
    with open(os.path.join(CATALOG, alias + ".json"), encoding="utf-8") as f:
        config = json.load(f)
    config.pop("_vramscope")
    return config


def _estimate_parameters(model):
    proc = subprocess.run([fidelity.VRAMSCOPE, "estimate", model, "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["model"]["parameters"]


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
    assert _estimate_parameters(str(path)) == _parameters(_build(config))


@pytest.mark.parametrize("alias, parameters",
                         [("sd-1.5-unet", 859_520_964), ("sdxl-base-unet", 2_567_463_684)])
def test_catalog_unets_have_the_parameters_diffusers_makes(alias, parameters):
    """The catalog's published configs, built by diffusers on the meta device (no memory,
    exact shapes), and read by vramscope: the same count, which is also the catalog's
    reference_parameters."""
    if not os.path.exists(fidelity.VRAMSCOPE):
        pytest.fail(f"{fidelity.VRAMSCOPE} is missing: run scripts/build.sh")
    with torch.device("meta"):
        model = diffusers.UNet2DConditionModel.from_config(_catalog_config(alias))
    assert _parameters(model) == parameters
    assert _estimate_parameters(alias) == parameters
