"""--from FILE: LitGPT fine-tuning configs (`litgpt finetune_lora | finetune_full --config
FILE`), read as litgpt 0.5.13's scripts read them (docs/configs.md).

Each example LitGPT config in examples/configs/ must give, number for number, the report
of the flags it stands for; each mapped key is checked on its own; unmodelled keys are
listed; a flag on the command line wins; a malformed file is one line naming the file and
the key, exit 2.
"""
import json

import pytest
import yaml

from from_file_helpers import CFG, run, estimate, numbers, lines, write

QLORA = ["--precision", "bf16", "--finetune", "qlora", "--lora-rank", 16, "--lora-dtype", "model",
         "--lora-dropout", 0.05, "--lora-targets", "q,v,gate,up,down", "--batch", 4,
         "--grad-accum", 4, "--seq", 1024, "--optimizer", "paged-adamw", "--gpus", 1]
FULL = ["--precision", "bf16-mixed", "--finetune", "full", "--batch", 2, "--grad-accum", 4,
        "--seq", 2048, "--optimizer", "adamw", "--gpus", 8, "--fsdp", "full",
        "--fsdp-version", 1, "--fsdp-wrap", "layers", "--fsdp-backward-prefetch", "pre",
        "--grad-ckpt", "full"]
# finetune_full's defaults with max_seq_length given: bf16-mixed, micro-batch 1, global 16.
BASE = ["--precision", "bf16-mixed", "--finetune", "full", "--batch", 1, "--grad-accum", 16,
        "--seq", 512, "--gpus", 1]


def litgpt(flags):
    """Both scripts' chunked lm_head and loss; their own GPT (--impl litgpt) but under
    quantize (bitsandbytes layers: transformers' and PEFT's modules)."""
    own = flags[flags.index("--finetune") + 1] in ("full", "lora")
    return list(flags) + ["--loss", "litgpt-chunked"] + (["--impl", "litgpt"] if own else [])


@pytest.mark.parametrize("file,flags", [
    ("litgpt_lora.yaml", QLORA),
    ("litgpt_full.yaml", FULL),
])
def test_example_equals_its_flags(file, flags):
    from_file = estimate("--from", CFG / file)
    assert numbers(from_file) == numbers(estimate(*litgpt(flags)))
    sources = lines(from_file, "from file")
    assert sources and all(file in s for s in sources), sources


def config(tmp_path, body, name="litgpt.yaml"):
    cfg = {"checkpoint_dir": "checkpoints/Qwen/Qwen2.5-0.5B", "train": {"max_seq_length": 512}}
    for key, value in body.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return write(tmp_path, name, yaml.safe_dump(cfg))


LORA = ["--finetune", "lora", "--lora-rank", 8, "--lora-dropout", 0.05, "--lora-targets", "q,v",
        "--lora-dtype", "model"]


@pytest.mark.parametrize("body,flags", [
    ({}, BASE),
    ({"precision": "bf16-true"}, ["--precision", "bf16"] + BASE[2:]),
    ({"precision": "16-mixed"}, ["--precision", "fp16-mixed"] + BASE[2:]),
    ({"precision": "32-true"}, ["--precision", "fp32"] + BASE[2:]),
    ({"train": {"micro_batch_size": 4, "global_batch_size": 32}},
     BASE[:4] + ["--batch", 4, "--grad-accum", 8] + BASE[8:]),
    ({"lora_r": 8}, BASE[:2] + LORA + BASE[4:]),
    ({"lora_r": 4, "lora_key": True, "lora_projection": True, "lora_mlp": True,
      "lora_head": True, "lora_dropout": 0.0},
     BASE[:2] + ["--finetune", "lora", "--lora-rank", 4, "--lora-dropout", 0,
                 "--lora-targets", "q,k,v,o,gate,up,down,lm_head", "--lora-dtype", "model"]
     + BASE[4:]),
    ({"lora_r": 8, "precision": "bf16-true", "quantize": "bnb.nf4-dq"},
     ["--precision", "bf16", "--finetune", "qlora"] + LORA[2:] + BASE[4:]
     + ["--optimizer", "paged-adamw"]),
    ({"optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"fused": True}}},
     BASE + ["--optimizer", "adamw-fused"]),
    ({"optimizer": "SGD"}, BASE + ["--optimizer", "sgd"]),
    ({"devices": 4, "train": {"global_batch_size": 16, "micro_batch_size": 2}},
     BASE[:4] + ["--batch", 2, "--grad-accum", 2, "--seq", 512, "--gpus", 4, "--fsdp", "full",
                 "--fsdp-version", 1, "--fsdp-wrap", "layers", "--fsdp-backward-prefetch", "pre",
        "--grad-ckpt", "full"]),
    ({"devices": 2, "lora_r": 8},
     BASE[:2] + LORA + BASE[4:6] + ["--grad-accum", 8, "--seq", 512, "--gpus", 2, "--fsdp",
                                     "full", "--fsdp-version", 2, "--fsdp-wrap", "layers",
                                     "--grad-ckpt", "full"]),
])
def test_each_key(tmp_path, body, flags):
    assert numbers(estimate("--from", config(tmp_path, body))) == numbers(estimate(*litgpt(flags)))


def test_unmodelled_keys_are_listed_and_warned(tmp_path):
    path = config(tmp_path, {"lora_r": 8, "precision": "bf16-true", "quantize": "bnb.nf4",
                             "train": {"max_seq_length": None},
                             "optimizer": "RMSprop"})
    p = run("estimate", "qwen2.5-0.5b", "--from", path, "--seq", 256, "--json")
    assert p.returncode == 0, p.stderr
    unmodelled = " ".join(lines(json.loads(p.stdout), "unmodelled"))
    for key in ("quantize", "max_seq_length", "RMSprop", "bitsandbytes weights"):
        assert key in unmodelled and key in p.stderr, key


def test_checkpoint_dir_is_a_note(tmp_path):
    notes = " ".join(lines(estimate("--from", config(tmp_path, {})), "from file"))
    assert "Qwen2.5-0.5B" in notes and "MODEL argument" in notes


def test_the_command_line_wins(tmp_path):
    path = config(tmp_path, {"precision": "bf16-true", "train": {"micro_batch_size": 8}})
    got = estimate("--from", path, "--batch", 2, "--precision", "fp32")
    assert numbers(got) == numbers(estimate(*litgpt(["--precision", "fp32"] + BASE[2:4]
                                                     + ["--batch", 2, "--grad-accum", 2]
                                                     + BASE[8:])))


def test_full_sets_litgpt_modules_and_loss(tmp_path):
    """finetune_full: LitGPT's own GPT and chunked loss, named in the sources; its estimate
    differs from transformers' modules with transformers' loss."""
    got = estimate("--from", config(tmp_path, {}))
    sources = " ".join(lines(got, "from file"))
    assert "--impl litgpt" in sources and "--loss litgpt-chunked" in sources, sources
    assert numbers(got) != numbers(estimate(*BASE))


def test_lora_sets_litgpt_modules(tmp_path):
    """finetune_lora without quantize: lora.py's GPT (LoRAQKVLinear over the fused qkv) under
    --impl litgpt, named in the sources and not listed as unmodelled; its estimate differs
    from transformers' and PEFT's modules with the same loss."""
    got = estimate("--from", config(tmp_path, {"lora_r": 8}))
    sources = " ".join(lines(got, "from file"))
    assert "--impl litgpt" in sources and "LoRAQKVLinear" in sources, sources
    assert not any("qkv" in u for u in lines(got, "unmodelled")), lines(got, "unmodelled")
    assert numbers(got) != numbers(estimate(*(BASE[:2] + LORA + BASE[4:]),
                                            "--loss", "litgpt-chunked"))


def test_other_families_are_refused_naming_them(tmp_path):
    """--impl litgpt lowers llama-style GPTs; GPT-2 is refused with its family named, and
    --impl transformers on the command line estimates it with transformers' modules. The
    refusal names the file (the --impl it set was not typed: issue 42)."""
    path = config(tmp_path, {})
    p = run("estimate", "gpt2", "--from", path)
    assert p.returncode == 2 and f"{path} (finetune_full" in p.stderr and "gpt2" in p.stderr, \
        p.stderr
    p = run("estimate", "gpt2", "--from", path, "--impl", "transformers", "--json")
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("body,key", [
    ({"precision": "bf16-fancy"}, "precision"),
    ({"precision": 16}, "precision"),
    ({"devices": "two"}, "devices"),
    ({"train": {"micro_batch_size": 0}}, "train.micro_batch_size"),
    ({"train": {"micro_batch_size": 8, "global_batch_size": 4}}, "train.global_batch_size"),
    ({"train": {"max_seq_length": "long"}}, "train.max_seq_length"),
    ({"train": 3}, "train"),
    ({"lora_r": 0}, "lora_r"),
    ({"lora_r": 8, "lora_dropout": 1.5}, "lora_dropout"),
    ({"lora_r": 8, "lora_query": False, "lora_value": False}, "lora_query"),
    ({"lora_r": 8, "quantize": "bnb.nf4"}, "quantize"),  # default precision is bf16-mixed
    ({"lora_r": 8, "precision": "bf16-true", "quantize": "gptq"}, "quantize"),
    ({"lora_r": 8, "precision": "bf16-true", "quantize": "bnb.nf4", "devices": 2}, "quantize"),
    ({"precision": "bf16-true", "quantize": "bnb.nf4"}, "quantize"),
    ({"optimizer": 5}, "optimizer"),
])
def test_malformed_is_one_line_naming_file_and_key(tmp_path, body, key):
    path = config(tmp_path, body)
    p = run("estimate", "qwen2.5-0.5b", "--from", path)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and str(path) in p.stderr and key in p.stderr, p.stderr
