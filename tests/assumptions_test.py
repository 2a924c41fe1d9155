"""Every estimate says what it assumed, and the flag that changes each assumption (issue 18)."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
LORA = ["estimate", "qwen2.5-0.5b", "--finetune", "lora"]


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return p.stdout


def assumptions(*args):
    return {a["what"]: a for a in json.loads(run(*args, "--json"))["assumptions"]}


def test_the_lora_example_prints_its_assumptions_with_their_flags():
    text = run(*LORA)
    section = text[text.index("Assumed (change with the flag named)"):]
    for what, flag in [("weights", "--precision"), ("adapters", "--lora-rank"), ("optimizer", "--optimizer"),
                       ("attention", "--attn"), ("loss", "--loss"), ("libraries", "--transformers-version"),
                       ("steps", "--steps")]:
        line = next(l for l in section.splitlines() if l.strip().startswith(what))
        assert flag in line, line
    a = assumptions(*LORA)
    # Issue 40 item 1: the default is what today's libraries do. transformers 5 loads the
    # checkpoint's dtype (llama-3-8b: bfloat16); the words say whose default it is and name
    # the flag for fp32 master weights.
    weights = a["weights"]["assumed"]
    assert weights.startswith("bf16 weights") and "transformers 5" in weights
    assert 'dtype="auto"' in weights and "Trainer(bf16=True)" in weights
    assert "--precision bf16-mixed" in weights
    assert "rank 16" in a["adapters"]["assumed"] and "fp32" in a["adapters"]["assumed"]
    # The HF Trainer's default optimizer on torch >= 2.8: fused AdamW; the flag for foreach.
    assert "fused=True" in a["optimizer"]["assumed"] and "HF Trainer's default" in a["optimizer"]["assumed"]
    assert "--optimizer adamw " in a["optimizer"]["assumed"] + " "
    # fp32 master weights only when asked, and then no "default of" words.
    mixed = assumptions(*LORA, "--precision", "bf16-mixed", "--optimizer", "adamw-fused")
    assert "fp32 weights" in mixed["weights"]["assumed"] and "autocast(bfloat16)" in mixed["weights"]["assumed"]
    assert "--precision bf16" in mixed["weights"]["assumed"] and "default of" not in mixed["weights"]["assumed"]
    assert "fused=True" in mixed["optimizer"]["assumed"]


@pytest.mark.parametrize("args,precision,whose", [
    (["llama-3-8b"], "bf16", "transformers 5"),
    (["llama-3-8b", "--transformers-version", "4.57"], "bf16-mixed", "transformers 4.x"),
    (["gpt2"], "bf16-mixed", "float32 assumed"),  # its config names no dtype
    (["llama-3.2-1b", "--impl", "torchtune"], "bf16", "torchtune"),
    (["llama-3.2-1b", "--impl", "litgpt"], "bf16-mixed", "LitGPT"),
    (["llama-3.2-1b", "--gpus", "2", "--zero", "2"], "bf16-mixed", "DeepSpeed"),
    (["llama-3.2-1b", "--gpus", "2", "--fsdp", "full"], "bf16-mixed", "FSDP"),
    (["llama-3.2-1b", "--gpus", "2", "--ddp"], "bf16", "transformers 5"),
])
def test_the_default_precision_is_whose_library_runs_it(args, precision, whose):
    p = subprocess.run([BIN, "estimate", *args, "--seq", "256", "--json"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["knobs"]["precision"] == precision
    weights = next(a for a in r["assumptions"] if a["what"] == "weights")["assumed"]
    assert "the default of" in weights and whose in weights, weights


def test_a_given_precision_wins_over_the_default():
    p = subprocess.run([BIN, "estimate", "llama-3.2-1b", "--seq", "256", "--precision", "fp32", "--json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["knobs"]["precision"] == "fp32"
    weights = next(a for a in r["assumptions"] if a["what"] == "weights")["assumed"]
    assert "default of" not in weights


def test_every_named_flag_is_a_flag_of_estimate():
    help_text = run("estimate", "--help")
    for a in assumptions(*LORA).values():
        for flag in filter(None, (f.strip() for f in a["flag"].split(","))):
            assert flag in help_text, flag


def test_zero3_names_zero_init_and_its_flag():
    # Issue 39 item 5: without zero.Init the whole model is on every GPU before
    # DeepSpeed partitions it; the report says which is assumed, and how to change it.
    a = assumptions("estimate", "qwen2.5-0.5b", "--gpus", "4", "--zero", "3")
    assert a["zero.Init"]["flag"] == "--no-zero-init" and "deepspeed.zero.Init" in a["zero.Init"]["assumed"]
    assert a["DeepSpeed"]["flag"] == "--deepspeed-version" and "0.19.8" in a["DeepSpeed"]["assumed"]
    without = assumptions("estimate", "qwen2.5-0.5b", "--gpus", "4", "--zero", "3", "--no-zero-init")
    assert "moves the whole model" in without["zero.Init"]["assumed"]
    assert "zero.Init" not in assumptions("estimate", "qwen2.5-0.5b", "--gpus", "4", "--zero", "2")


def test_assumptions_follow_the_knobs():
    a = assumptions(*LORA, "--precision", "fp32", "--optimizer", "sgd", "--attn", "eager",
                    "--lora-rank", "64", "--no-attention-mask")
    assert a["weights"]["assumed"].startswith("fp32 weights, gradients")
    assert "SGD" in a["optimizer"]["assumed"]
    assert "eager" in a["attention"]["assumed"]
    assert "rank 64" in a["adapters"]["assumed"]
    assert "no attention_mask" in a["batch"]["assumed"] and a["batch"]["flag"] == ""
    full = assumptions("estimate", "qwen2.5-0.5b")
    assert "adapters" not in full
