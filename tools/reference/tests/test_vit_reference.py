"""ViTForImageClassification (vsref's vit family, docs/fidelity.md): `vramscope estimate`
counts the parameters transformers makes, for the
published vit-base-patch16-224 config and the reduced one the fidelity grid runs.

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
from vsref.models import catalog_config, reference_config  # noqa: E402


def _meta_model(config):
    cfg = transformers.ViTConfig(**{k: v for k, v in config.items() if k != "architectures"})
    with torch.device("meta"):
        return transformers.ViTForImageClassification(cfg)


def _estimate(path):
    proc = subprocess.run([fidelity.VRAMSCOPE, "estimate", str(path), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("config", [catalog_config("vit-base-patch16-224"),
                                    reference_config("vit")], ids=["published", "reduced"])
def test_estimate_counts_the_parameters_transformers_makes(config, tmp_path):
    if not transformers.__version__.startswith("5."):
        pytest.skip("the parameter names are transformers 5.x's")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    model = _meta_model(config)
    assert _estimate(path)["model"]["parameters"] == sum(p.numel() for p in model.parameters())
    assert model.config.num_labels == config["num_labels"]
