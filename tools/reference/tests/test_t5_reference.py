"""T5 (vsref's t5 and t5_v11 families, docs/fidelity.md): `vramscope estimate` counts the
parameters transformers makes, for the published t5-base, flan-t5-large and FLUX's
T5EncoderModel configs and the reduced ones the fidelity grid runs; and estimate refuses
what the lowering does not model.

Runs under .venv/tf5 (transformers 5.24, whose T5Config ties lm_head to `shared` even when
the config says tie_word_embeddings false).
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
    cfg = transformers.T5Config(**{k: v for k, v in config.items() if k != "architectures"})
    cls = getattr(transformers, config.get("architectures", ["T5ForConditionalGeneration"])[0])
    with torch.device("meta"):
        return cls(cfg)


def _estimate(path, *flags):
    return subprocess.run([fidelity.VRAMSCOPE, "estimate", str(path), "--json", *flags],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("config", [catalog_config("t5-base"), catalog_config("flan-t5-large"),
                                    reference_config("t5"), reference_config("t5_v11")],
                         ids=["t5-base", "flan-t5-large", "reduced-t5", "reduced-t5-v11"])
def test_estimate_counts_the_parameters_transformers_makes(config, tmp_path):
    if not transformers.__version__.startswith("5."):
        pytest.skip("the parameter names and the forced tying are transformers 5.x's")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    proc = _estimate(path, "--attn", "eager", "--seq", "32")
    assert proc.returncode == 0, proc.stderr
    model = _meta_model(config)
    assert json.loads(proc.stdout)["model"]["parameters"] == sum(
        p.numel() for p in model.parameters())


def test_the_encoder_alone_is_refused_with_its_reason(tmp_path):
    config = catalog_config("t5-v1_1-xxl-encoder")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    proc = _estimate(path, "--attn", "eager")
    assert proc.returncode == 2
    assert "T5EncoderModel has no head to train" in proc.stderr


def test_other_t5_heads_are_refused_by_name(tmp_path):
    config = dict(reference_config("t5"), architectures=["T5ForSequenceClassification"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    proc = _estimate(path, "--attn", "eager")
    assert proc.returncode == 2
    assert "architectures" in proc.stderr and "T5ForSequenceClassification" in proc.stderr
