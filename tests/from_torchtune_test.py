"""--from FILE: torchtune recipe configs (`tune run RECIPE --config FILE`), read as
torchtune 0.6.1's recipes read them (docs/configs.md).

Each example torchtune config in examples/configs/ must give, number for number, the
report of the flags it stands for; each mapped key is checked on its own; unmodelled keys
are listed; a flag on the command line wins; a malformed file is one line naming the file
and the key, exit 2.
"""
import json

import pytest
import yaml

import from_file_helpers
from from_file_helpers import CFG, run, numbers, lines, write


def estimate(*args):
    # The recipes' Qwen2.5 builders are torchtune's modules (--impl torchtune); the flag on
    # the command line names the same value the file sets.
    return from_file_helpers.estimate("--impl", "torchtune", *args)

LORA = ["--finetune", "lora", "--lora-rank", 16, "--lora-dropout", 0, "--lora-dtype", "model",
        "--lora-targets", "q,k,v,o,gate,up,down", "--precision", "bf16", "--batch", 4,
        "--grad-accum", 4, "--seq", 2048, "--grad-ckpt", "full", "--optimizer", "adamw-fused",
        "--loss", "torchtune-chunked"]
FULL_DIST = ["--finetune", "full", "--precision", "bf16", "--batch", 2, "--grad-accum", 1,
             "--seq", 1024, "--grad-ckpt", "full", "--optimizer", "adamw", "--loss", "torchtune-chunked", "--fsdp", "full",
             "--fsdp-version", 2, "--fsdp-wrap", "layers"]
# The smallest recipe config: a full model builder, fp32 (dtype absent), no checkpointing.
BASE = ["--finetune", "full", "--precision", "fp32", "--batch", 2, "--seq", 512,
        "--grad-ckpt", "none"]


@pytest.mark.parametrize("file,flags,extra", [
    ("torchtune_lora.yaml", LORA, []),
    ("torchtune_full_distributed.yaml", FULL_DIST, ["--gpus", 4]),
])
def test_example_equals_its_flags(file, flags, extra):
    from_file = estimate("--from", CFG / file, *extra)
    assert numbers(from_file) == numbers(estimate(*flags, *extra))
    sources = lines(from_file, "from file")
    assert sources and all(file in s for s in sources), sources


def recipe(tmp_path, body, name="recipe.yaml"):
    cfg = {"model": {"_component_": "torchtune.models.qwen2_5.qwen2_5_0_5b"},
           "tokenizer": {"_component_": "torchtune.models.qwen2_5.qwen2_5_tokenizer",
                         "max_seq_len": 512},
           "batch_size": 2}
    for key, value in body.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return write(tmp_path, name, yaml.safe_dump(cfg))


LORA_MODEL = {"_component_": "torchtune.models.qwen2_5.lora_qwen2_5_0_5b",
              "lora_attn_modules": ["q_proj", "v_proj"]}
LORA_FLAGS = ["--finetune", "lora", "--lora-rank", 8, "--lora-dropout", 0,
              "--lora-targets", "q,v", "--lora-dtype", "model"]


@pytest.mark.parametrize("body,flags", [
    ({}, BASE),
    ({"dtype": "bf16"}, BASE[:2] + ["--precision", "bf16"] + BASE[4:]),
    ({"gradient_accumulation_steps": 3}, BASE + ["--grad-accum", 3]),
    ({"enable_activation_checkpointing": True}, BASE[:-1] + ["full"]),
    ({"model": LORA_MODEL}, BASE[2:] + LORA_FLAGS),
    ({"model": {**LORA_MODEL, "apply_lora_to_mlp": True, "lora_rank": 32,
                "lora_dropout": 0.1}},
     BASE[2:] + ["--finetune", "lora", "--lora-rank", 32, "--lora-dropout", 0.1,
                 "--lora-targets", "q,v,gate,up,down", "--lora-dtype", "model"]),
    ({"dtype": "bf16",
      "model": {**LORA_MODEL, "_component_": "torchtune.models.qwen2_5.qlora_qwen2_5_0_5b"}},
     ["--precision", "bf16"] + BASE[4:] + ["--finetune", "qlora"] + LORA_FLAGS[2:]),
    ({"optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-5}},
     BASE + ["--optimizer", "adamw"]),
    ({"optimizer": {"_component_": "torch.optim.AdamW", "foreach": False}},
     BASE + ["--optimizer", "adamw-forloop"]),
    ({"optimizer": {"_component_": "bitsandbytes.optim.PagedAdamW8bit"}},
     BASE + ["--optimizer", "paged-adamw-8bit"]),
    ({"optimizer": {"_component_": "torch.optim.SGD", "momentum": 0.9}},
     BASE + ["--optimizer", "sgd-momentum"]),
    ({"optimizer_in_bwd": True}, BASE + ["--optimizer-in-backward"]),
    ({"loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"}},
     BASE + ["--loss", "torchtune-chunked"]),
    ({"fsdp_reshard_after_forward": False},
     BASE + ["--fsdp", "grad-op", "--fsdp-version", 2, "--fsdp-wrap", "layers"]),
    ({"fsdp_cpu_offload": True},
     BASE + ["--fsdp", "full", "--fsdp-version", 2, "--fsdp-wrap", "layers", "--offload", "params"]),
])
def test_each_key(tmp_path, body, flags):
    assert numbers(estimate("--from", recipe(tmp_path, body))) == numbers(estimate(*flags))


def test_unmodelled_keys_are_listed_and_warned(tmp_path):
    path = recipe(tmp_path, {"compile": True, "enable_activation_checkpointing": True,
                             "enable_activation_offloading": True,
                             "tokenizer": {"max_seq_len": None},
                             "loss": {"_component_": "torchtune.rlhf.loss.DPOLoss"},
                             "model": {**LORA_MODEL, "use_dora": True,
                                       "_component_": "torchtune.models.gemma.lora_gemma_2b"}})
    p = run("estimate", "qwen2.5-0.5b", "--from", path, "--seq", 256, "--json")
    assert p.returncode == 0, p.stderr
    unmodelled = " ".join(lines(json.loads(p.stdout), "unmodelled"))
    for key in ("compile", "enable_activation_offloading", "max_seq_len", "DPOLoss", "use_dora"):
        assert key in unmodelled and key in p.stderr, key


def test_activation_offloading_with_torchtune_modules(tmp_path):
    # A Llama builder: torchtune's own modules, whose OffloadActivations is modelled.
    # LoRA at 4k tokens, so that the checkpointed layer inputs matter at the peak.
    model = {**LORA_MODEL, "_component_": "torchtune.models.llama3_2.lora_llama3_2_1b"}
    path = recipe(tmp_path, {"model": model, "dtype": "bf16", "tokenizer": {"max_seq_len": 4096},
                             "enable_activation_checkpointing": True,
                             "enable_activation_offloading": True})
    flags = ["--precision", "bf16", "--batch", 2, "--seq", 4096, "--grad-ckpt", "full",
             "--impl", "torchtune", "--json"] + LORA_FLAGS
    reports = [run("estimate", "llama-3.2-1b", *args) for args in
               (["--from", path, "--json"], flags + ["--activation-offload"], flags)]
    for p in reports:
        assert p.returncode == 0, p.stderr
    from_file, offloaded, kept = (json.loads(p.stdout) for p in reports)
    assert numbers(from_file) == numbers(offloaded)
    assert not lines(from_file, "unmodelled")
    assert offloaded["peak_allocated_bytes"] < kept["peak_allocated_bytes"]
    assert offloaded["host_peak_bytes"] > 0 == kept["host_peak_bytes"]


def test_model_component_is_a_note(tmp_path):
    notes = " ".join(lines(estimate("--from", recipe(tmp_path, {})), "from file"))
    assert "qwen2_5_0_5b" in notes and "MODEL argument" in notes


def test_the_command_line_wins(tmp_path):
    path = recipe(tmp_path, {"dtype": "bf16", "batch_size": 8})
    got = estimate("--from", path, "--batch", 1, "--precision", "bf16-mixed")
    assert numbers(got) == numbers(estimate(*(BASE[:2] + ["--precision", "bf16-mixed",
                                                          "--batch", 1] + BASE[6:])))


@pytest.mark.parametrize("body,key", [
    ({"batch_size": "four"}, "batch_size"),
    ({"batch_size": 0}, "batch_size"),
    ({"dtype": "fp16"}, "dtype"),
    ({"dtype": "int8"}, "dtype"),
    ({"tokenizer": {"max_seq_len": "long"}}, "tokenizer.max_seq_len"),
    ({"tokenizer": {"max_seq_len": None}, "dataset": {"packed": True}}, "dataset.packed"),
    ({"enable_activation_offloading": True}, "enable_activation_offloading"),
    ({"enable_activation_checkpointing": "yes"}, "enable_activation_checkpointing"),
    ({"optimizer_in_bwd": True, "gradient_accumulation_steps": 4}, "optimizer_in_bwd"),
    ({"optimizer": {"lr": 1e-5}}, "optimizer._component_"),
    ({"optimizer": [1]}, "optimizer"),
    ({"model": {"_component_": "torchtune.models.qwen2_5.lora_qwen2_5_0_5b"}},
     "model.lora_attn_modules"),
    ({"model": {**LORA_MODEL, "lora_attn_modules": ["qkv"]}}, "model.lora_attn_modules"),
    ({"model": {**LORA_MODEL, "lora_rank": -1}}, "model.lora_rank"),
    ({"model": {**LORA_MODEL, "lora_dropout": 2}}, "model.lora_dropout"),
])
def test_malformed_is_one_line_naming_file_and_key(tmp_path, body, key):
    path = recipe(tmp_path, body)
    p = run("estimate", "qwen2.5-0.5b", "--from", path)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and str(path) in p.stderr and key in p.stderr, p.stderr


def test_recipe_configs_shipped_with_torchtune_read(tmp_path):
    # torchtune's own configs are not in this repository: a shape of them, written here.
    text = ("model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n"
            "  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']\n"
            "  apply_lora_to_mlp: True\n  lora_rank: 64\n"
            "tokenizer:\n  _component_: torchtune.models.llama3.llama3_tokenizer\n"
            "  path: /tmp/tokenizer.model\n  max_seq_len: null\n"
            "output_dir: ${output_dir}\nbatch_size: 4\ndtype: bf16\n")
    path = write(tmp_path, "1B_lora_single_device.yaml", text)
    p = run("estimate", "llama-3.2-1b", "--from", path, "--seq", 128, "--json")
    assert p.returncode == 0, p.stderr
    flags = ["--impl", "torchtune", "--finetune", "lora", "--lora-rank", 64, "--lora-dropout", 0,
             "--lora-dtype", "model", "--lora-targets", "q,v,o,gate,up,down", "--batch", 4,
             "--precision", "bf16", "--grad-ckpt", "none", "--seq", 128]
    q = run("estimate", "llama-3.2-1b", *flags, "--json")
    assert q.returncode == 0, q.stderr
    assert numbers(json.loads(p.stdout)) == numbers(json.loads(q.stdout))


def test_impl_torchtune_only_for_llama_mistral_and_qwen2_builders(tmp_path):
    # A Gemma builder's modules are estimated as transformers' and listed.
    gemma = {"model": {"_component_": "torchtune.models.gemma.gemma_2b"}}
    p = run("estimate", "gemma-2b", "--from", recipe(tmp_path, gemma), "--json")
    assert p.returncode == 0, p.stderr
    assert "--impl" not in " ".join(lines(json.loads(p.stdout), "from file"))
    assert "this family" in " ".join(lines(json.loads(p.stdout), "unmodelled"))
    # A Llama builder's config given to a Gemma model: --impl torchtune refuses it, and
    # the message names the file's key, not the flag the user did not type (issue 42).
    path = recipe(tmp_path, {"model": {"_component_": "torchtune.models.llama3_2.llama3_2_1b"}},
                  name="llama.yaml")
    p = run("estimate", "gemma-2b", "--from", path)
    assert p.returncode == 2 and f"{path}: model._component_" in p.stderr, p.stderr
    assert "--impl" not in p.stderr, p.stderr