"""--from FILE: TRL's SFTConfig / DPOConfig (and `trl sft|dpo --config` YAML with
ModelConfig's keys), read as TRL 1.16 (docs/configs.md).

Each example TRL config in examples/configs/ must give, number for number, the report of
the flags it stands for; each mapped key is checked on its own; unmodelled keys are listed;
a flag on the command line wins; a malformed file is one line naming the file and the key,
exit 2.
"""
import json

import pytest

from from_file_helpers import CFG, run, estimate, numbers, lines, write

# TRL's trainers: the fused LM head; gradient checkpointing on (non-reentrant under
# transformers 5.x, vramscope's default version); bf16 autocast over the weights
# from_pretrained loads without model_init_kwargs.dtype: the default precision.
TRL = ["--loss", "trl-fused", "--grad-ckpt", "full", "--seq", 1024]
SFT_LORA = ["--loss", "trl-fused", "--grad-ckpt", "full", "--precision", "bf16", "--seq", 2048,
            "--batch", 4, "--grad-accum", 4, "--packing", "--finetune", "lora",
            "--lora-rank", 32, "--lora-targets", "all-linear"]
DPO = TRL + ["--batch", 2, "--grad-accum", 8, "--dpo"]


@pytest.mark.parametrize("file,flags", [
    ("trl_sft_lora.yaml", SFT_LORA),
    ("trl_dpo.json", DPO),
])
def test_example_equals_its_flags(file, flags):
    from_file = estimate("--from", CFG / file)
    assert numbers(from_file) == numbers(estimate(*flags))
    sources = lines(from_file, "from file")
    assert sources and all(file in s for s in sources), sources


def sft(tmp_path, body, name="sft.json"):
    text = json.dumps({"output_dir": "out", "dataset_text_field": "text", **body})
    return write(tmp_path, name, text)


@pytest.mark.parametrize("body,flags", [
    ({}, TRL),
    ({"per_device_train_batch_size": 3, "gradient_accumulation_steps": 5},
     TRL + ["--batch", 3, "--grad-accum", 5]),
    ({"max_length": 512}, TRL[:-2] + ["--seq", 512]),
    ({"gradient_checkpointing": False}, ["--loss", "trl-fused", "--seq", 1024]),
    ({"model_init_kwargs": {"dtype": "float32"}},
     TRL[:4] + ["--precision", "bf16-mixed", "--seq", 1024]),
    ({"gradient_checkpointing_kwargs": {"use_reentrant": True}},
     TRL[:2] + ["--grad-ckpt", "reentrant"] + TRL[4:]),
    ({"fp16": True}, TRL[:4] + ["--precision", "fp16-mixed", "--seq", 1024]),
    ({"model_init_kwargs": {"dtype": "bfloat16"}}, TRL[:4] + ["--precision", "bf16", "--seq", 1024]),
    ({"model_init_kwargs": "{\"dtype\": \"float16\"}"},
     TRL[:4] + ["--precision", "fp16", "--seq", 1024]),
    ({"packing": True}, TRL + ["--packing"]),
    ({"packing": True, "packing_strategy": "wrapped"}, TRL),
    ({"padding_free": True}, TRL + ["--packing"]),
    ({"use_peft": True}, TRL + ["--finetune", "lora", "--lora-rank", 16]),
    ({"use_peft": True, "load_in_4bit": True, "lora_r": 8, "lora_dropout": 0.1,
      "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
     TRL + ["--finetune", "qlora", "--lora-rank", 8, "--lora-dropout", 0.1,
            "--lora-targets", "q,k,v,o"]),
    ({"optim": "adamw_torch_fused"}, TRL + ["--optimizer", "adamw-fused"]),
])
def test_each_sft_key(tmp_path, body, flags):
    assert numbers(estimate("--from", sft(tmp_path, body))) == numbers(estimate(*flags))


def test_dpo_keys(tmp_path):
    path = write(tmp_path, "dpo.json", json.dumps(
        {"output_dir": "o", "beta": 0.1, "precompute_ref_log_probs": True, "use_peft": True}))
    flags = TRL + ["--dpo", "--dpo-precompute-ref", "--finetune", "lora", "--lora-rank", 16]
    assert numbers(estimate("--from", path)) == numbers(estimate(*flags))


def test_unmodelled_keys_are_listed_and_warned(tmp_path):
    path = sft(tmp_path, {"activation_offloading": True,
                          "use_peft": True, "use_dora": True,
                          "lora_target_modules": ["q_proj", "mlp.experts"]})
    p = run("estimate", "qwen2.5-0.5b", "--from", path, "--json")
    assert p.returncode == 0, p.stderr
    unmodelled = " ".join(lines(json.loads(p.stdout), "unmodelled"))
    for key in ("activation_offloading", "use_dora", "mlp.experts"):
        assert key in unmodelled and key in p.stderr, key


def test_use_liger_kernel_is_liger_with_trls_own_head(tmp_path):
    # TRL 1.16 keeps its fused head (--loss trl-fused); Liger's layer kernels are --liger.
    path = sft(tmp_path, {"use_liger_kernel": True})
    r = estimate("--from", path)
    assert numbers(r) == numbers(estimate("--from", sft(tmp_path, {}), "--liger"))
    assert any("use_liger_kernel" in s for s in lines(r, "from file"))


def test_completion_only_loss_is_a_note(tmp_path):
    r = estimate("--from", sft(tmp_path, {"completion_only_loss": True}))
    assert any("completion_only_loss" in s and "upper bound" in s for s in lines(r, "from file"))


def test_the_command_line_wins(tmp_path):
    path = sft(tmp_path, {"max_length": 512, "per_device_train_batch_size": 8})
    got = estimate("--from", path, "--seq", 256, "--loss", "hf")
    want = estimate("--grad-ckpt", "full", "--seq", 256,
                    "--batch", 8, "--loss", "hf")
    assert numbers(got) == numbers(want)


@pytest.mark.parametrize("body,key", [
    ({"max_length": "long"}, "max_length"),
    ({"max_length": 0}, "max_length"),
    ({"packing": "yes"}, "packing"),
    ({"packing_strategy": "ffd"}, "packing_strategy"),
    ({"use_peft": True, "lora_r": 2.5}, "lora_r"),
    ({"use_peft": True, "lora_dropout": 1.5}, "lora_dropout"),
    ({"use_peft": True, "lora_target_modules": 7}, "lora_target_modules"),
    ({"model_init_kwargs": 3}, "model_init_kwargs"),
    ({"model_init_kwargs": {"dtype": "float8"}}, "model_init_kwargs.dtype"),
    ({"dtype": "int4"}, "dtype"),
])
def test_malformed_is_one_line_naming_file_and_key(tmp_path, body, key):
    path = sft(tmp_path, body)
    p = run("estimate", "qwen2.5-0.5b", "--from", path)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and str(path) in p.stderr and key in p.stderr, p.stderr


def test_yaml_detection(tmp_path):
    # A `trl sft --config` YAML is read as TRL, not as an accelerate config.
    path = write(tmp_path, "run.yaml", "model_name_or_path: Qwen/Qwen2.5-0.5B\nmax_length: 512\n")
    assert numbers(estimate("--from", path)) == numbers(estimate(*(TRL[:-2] + ["--seq", 512])))
