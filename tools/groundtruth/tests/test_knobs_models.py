"""Knob normalisation and model resolution (catalog files, paths, hub ids)."""

import json

import pytest

from gtlib import knobs, models


def test_defaults_follow_vramscope_estimate():
    k = knobs.normalize_knobs({"model": "gpt2"})
    assert k == {"model": "gpt2", "batch": 1, "seq": 2048, "grad_accum": 1,
                 "precision": "bf16-mixed", "optimizer": "adamw", "finetune": "full",
                 "grad_ckpt": "none", "attn": "sdpa", "loss": "hf", "alloc_conf": "", "steps": 3}
    assert list(k) == [n for n in knobs.KNOB_ORDER if n in k]


def test_lora_knobs_present_only_for_lora_and_qlora():
    k = knobs.normalize_knobs({"model": "m", "finetune": "qlora", "lora_dropout": 0})
    assert (k["lora_rank"], k["lora_targets"], k["lora_dropout"]) == (16, "q,v", 0.0)
    assert "lora_rank" not in knobs.normalize_knobs({"model": "m", "lora_rank": 99})


@pytest.mark.parametrize("value, expected", [
    ("v,q", "q,v"), (["down", "q", "q"], "q,down"), (" all-linear ", "all-linear"),
    ("lm_head,o", "o,lm_head"),
])
def test_lora_targets_canonical(value, expected):
    k = knobs.normalize_knobs({"model": "m", "finetune": "lora", "lora_targets": value})
    assert k["lora_targets"] == expected


@pytest.mark.parametrize("value, message", [
    ("all-linear,q", "cannot be combined"), ("", "is empty"), (3, "must be a string"),
])
def test_lora_targets_errors(value, message):
    with pytest.raises(knobs.KnobError, match=message):
        knobs.normalize_knobs({"model": "m", "finetune": "lora", "lora_targets": value})


def test_alloc_conf_canonical_and_checked():
    k = knobs.normalize_knobs({"model": "m", "alloc_conf":
                               " expandable_segments:True , roundup_power2_divisions:[256:1,>:8]"})
    assert k["alloc_conf"] == "expandable_segments:True,roundup_power2_divisions:[256:1,>:8]"
    for bad in ("x:y;rm -rf", "a:[1", "a:1]", ":1", "$HOME:1"):
        with pytest.raises(knobs.KnobError, match="alloc_conf"):
            knobs.normalize_knobs({"model": "m", "alloc_conf": bad})


def test_estimate_flags():
    k = knobs.normalize_knobs({"model": "gpt2", "finetune": "lora", "grad_accum": 2,
                               "alloc_conf": "expandable_segments:True"})
    flags = knobs.estimate_flags(k)
    assert flags[0] == "gpt2"
    assert flags[flags.index("--grad-accum") + 1] == "2"
    assert flags[flags.index("--lora-targets") + 1] == "q,v"
    assert flags[flags.index("--alloc-conf") + 1] == "expandable_segments:True"
    assert flags[-2:] == ["--steps", "3"]


def test_resolve_alias_strips_vramscope_key(model_dirs):
    m = models.resolve_model("tiny-llama", model_dirs)
    assert m.alias == "tiny-llama" and m.hub_id == "example/tiny-llama"
    assert "_vramscope" not in m.config and m.config["model_type"] == "llama"


def test_resolve_hub_id_case_insensitive(model_dirs):
    assert models.resolve_model("Example/Tiny-GPT2", model_dirs).alias == "tiny-gpt2"


def test_resolve_paths(tmp_path, model_dirs):
    cfg = {"model_type": "llama", "vocab_size": 10}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert models.resolve_model(str(tmp_path), model_dirs).config == cfg
    assert models.resolve_model(str(tmp_path / "config.json"), model_dirs).config == cfg
    with pytest.raises(models.ModelError, match="does not exist"):
        models.resolve_model(str(tmp_path / "nope.json"), model_dirs)


@pytest.mark.parametrize("content, message", [
    ("{", "not valid JSON"), ("[1]", "must be a JSON object"),
    ('{"vocab_size": 3}', "no 'model_type'"), ('{"model_type": "x", "_vramscope": 3}', "'_vramscope'"),
])
def test_bad_config_files(tmp_path, content, message):
    path = tmp_path / "c.json"
    path.write_text(content)
    with pytest.raises(models.ModelError, match=message):
        models.resolve_model(str(path), ())


def test_unknown_model_says_where_it_looked(model_dirs):
    with pytest.raises(models.ModelError, match="never downloads"):
        models.resolve_model("no-such-model", model_dirs)
    with pytest.raises(models.ModelError):
        models.resolve_model("../../etc/passwd", model_dirs)


def test_list_aliases(model_dirs):
    assert "tiny-llama" in models.list_aliases(model_dirs)
