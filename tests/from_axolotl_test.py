"""--from FILE: Axolotl's training config YAML (docs/configs.md, axolotl 0.18).

Each example Axolotl config in examples/configs/ must give, number for number,
the report of the flags it stands for; each mapped key is checked on its own;
unmodelled keys are listed and warned; a flag on the command line wins; a
malformed file is one line naming the file and the key, exit 2.
"""
import json

import pytest

from from_file_helpers import CFG, MODEL, run, estimate, numbers, lines, write


# Axolotl's defaults that differ from vramscope's: sequence_len 512,
# optimizer adamw_torch_fused, bf16 "auto" (bf16 weights on a GPU with bf16).
DEFAULTS = ["--seq", 512, "--optimizer", "adamw-fused", "--precision", "bf16"]
QLORA = ["--seq", 4096, "--batch", 2, "--grad-accum", 4, "--precision", "bf16",
         "--finetune", "qlora", "--lora-rank", 32, "--lora-dropout", 0.05,
         "--lora-targets", "all-linear", "--grad-ckpt", "reentrant", "--attn", "flash",
         "--optimizer", "paged-adamw"]
# ds_zero2_auto.json: stage 2, FusedAdam, HF's "auto" sizes; DeepSpeed keeps
# fp32 masters of the bf16 module: bf16-mixed.
FULL_DS = ["--seq", 2048, "--batch", 4, "--grad-accum", 8, "--precision", "bf16-mixed",
           "--grad-ckpt", "full", "--attn", "flash", "--optimizer", "adamw-fused", "--zero", 2,
           "--zero-buckets", "hf-auto", "--zero-prefetch-bucket-size", 50000000,
           "--zero-persistence-threshold", 100000, "--zero-overlap-comm", "on"]  # overlap_comm true


@pytest.mark.parametrize("file,extra,flags", [
    ("axolotl_qlora.yaml", [], QLORA),
    ("axolotl_full_ds.yaml", ["--gpus", 8], ["--gpus", 8] + FULL_DS),
])
def test_example_equals_its_flags(file, extra, flags):
    from_file = estimate("--from", CFG / file, *extra)
    assert numbers(from_file) == numbers(estimate(*flags))
    sources = lines(from_file, "from file")
    assert sources and all(file in s or "ds_zero2_auto.json" in s for s in sources), sources


def test_base_model_is_reported_not_applied():
    r = estimate("--from", CFG / "axolotl_qlora.yaml")
    assert any("meta-llama/Meta-Llama-3-8B" in s and "base_model" in s and "MODEL" in s
               for s in lines(r, "from file")), lines(r, "from file")
    assert r["model"] == estimate(*QLORA)["model"]


def ax(tmp_path, body, name="ax.yaml"):
    return write(tmp_path, name, "base_model: Qwen/Qwen2.5-0.5B\nsequence_len: 1024\n" + body)


S = ["--seq", 1024]


@pytest.mark.parametrize("body,flags", [
    ("", S + DEFAULTS[2:]),
    ("micro_batch_size: 3\ngradient_accumulation_steps: 5\n",
     S + DEFAULTS[2:] + ["--batch", 3, "--grad-accum", 5]),
    ("micro_batch_size: 2\nbatch_size: 16\n", S + DEFAULTS[2:] + ["--batch", 2, "--grad-accum", 8]),
    ("bf16: true\n", S + DEFAULTS[2:]),
    ("bf16: false\n", S + ["--optimizer", "adamw-fused", "--precision", "fp32"]),
    ("fp16: true\n", S + ["--optimizer", "adamw-fused", "--precision", "fp16"]),
    ("bf16: true\nfp16: true\n", S + DEFAULTS[2:]),
    ("bf16: false\nbfloat16: true\n", S + DEFAULTS[2:]),
    ("bf16: false\nfloat16: true\n", S + ["--optimizer", "adamw-fused", "--precision", "fp16"]),
    ("adapter: lora\n", S + DEFAULTS[2:] + ["--finetune", "lora", "--lora-dropout", 0]),
    ("adapter: lora\nlora_r: 8\nlora_dropout: 0.1\nlora_target_modules:\n  - q_proj\n"
     "  - k_proj\n  - v_proj\n  - o_proj\n",
     S + DEFAULTS[2:] + ["--finetune", "lora", "--lora-rank", 8, "--lora-dropout", 0.1,
                         "--lora-targets", "q,k,v,o"]),
    ("adapter: lora\nlora_target_linear: true\nlora_target_modules: [lm_head]\n",
     S + DEFAULTS[2:] + ["--finetune", "lora", "--lora-dropout", 0,
                         "--lora-targets", "all-linear,lm_head"]),
    ("adapter: lora\nlora_target_modules: all-linear\n",
     S + DEFAULTS[2:] + ["--finetune", "lora", "--lora-dropout", 0, "--lora-targets", "all-linear"]),
    ("adapter: qlora\nload_in_4bit: true\n",
     S + DEFAULTS[2:] + ["--finetune", "qlora", "--lora-dropout", 0]),
    ("gradient_checkpointing: true\n", S + DEFAULTS[2:] + ["--grad-ckpt", "reentrant"]),
    ("gradient_checkpointing: true\ngradient_checkpointing_kwargs:\n  use_reentrant: false\n",
     S + DEFAULTS[2:] + ["--grad-ckpt", "full"]),
    ("gradient_checkpointing: true\ngradient_checkpointing_kwargs: {}\n",  # transformers 5
     S + DEFAULTS[2:] + ["--grad-ckpt", "full"]),
    ("flash_attention: true\n", S + DEFAULTS[2:] + ["--attn", "flash"]),
    ("sdp_attention: true\n", S + DEFAULTS[2:] + ["--attn", "sdpa"]),
    ("attn_implementation: eager\n", S + DEFAULTS[2:] + ["--attn", "eager"]),
    ("attn_implementation: flash_attention_2\n", S + DEFAULTS[2:] + ["--attn", "flash"]),
    ("optimizer: adamw_torch\n", S + ["--precision", "bf16", "--optimizer", "adamw"]),
    ("optimizer: adamw_bnb_8bit\n", S + ["--precision", "bf16", "--optimizer", "adamw-8bit"]),
    ("optimizer: paged_adamw_8bit\n",
     S + ["--precision", "bf16", "--optimizer", "paged-adamw-8bit"]),
    ("optimizer: adafactor\n", S + ["--precision", "bf16", "--optimizer", "adafactor"]),
    ("optimizer: sgd\n", S + ["--precision", "bf16", "--optimizer", "sgd"]),
    ("optimizer: sgd\noptim_args:\n  momentum: 0.9\n",
     S + ["--precision", "bf16", "--optimizer", "sgd-momentum"]),
    ("liger_fused_linear_cross_entropy: true\n", S + DEFAULTS[2:] + ["--loss", "fused-linear"]),
    ("plugins:\n  - axolotl.integrations.liger.LigerPlugin\nliger_rope: true\nliger_rms_norm: true\n"
     "liger_glu_activation: true\nliger_fused_linear_cross_entropy: true\n",
     S + DEFAULTS[2:] + ["--liger"]),
    ("deepspeed:\n  zero_optimization:\n    stage: 3\n",
     S + ["--optimizer", "adamw-fused", "--precision", "bf16-mixed", "--zero", 3]),
    ("fsdp_version: 2\nfsdp_config:\n  offload_params: true\n  activation_checkpointing: true\n",
     S + ["--optimizer", "adamw-fused", "--precision", "bf16-mixed", "--fsdp", "full",
          "--fsdp-version", 2, "--offload", "params", "--grad-ckpt", "full"]),
    ("fsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: false\n",
     S + ["--optimizer", "adamw-fused", "--precision", "bf16-mixed", "--fsdp", "grad-op",
          "--fsdp-version", 2]),
    ("fsdp:\n  - shard_grad_op\n  - auto_wrap\nfsdp_config:\n  fsdp_offload_params: false\n",
     S + ["--optimizer", "adamw-fused", "--precision", "bf16-mixed", "--fsdp", "grad-op",
          "--fsdp-version", 1]),
])
def test_each_key_maps_to_its_flag(tmp_path, body, flags):
    assert numbers(estimate("--from", ax(tmp_path, body))) == numbers(estimate(*flags))


def test_absent_sequence_len_is_axolotls_default(tmp_path):
    path = write(tmp_path, "ax.yaml", "base_model: x\nmicro_batch_size: 1\n")
    r = estimate("--from", path)
    assert numbers(r) == numbers(estimate(*DEFAULTS))
    assert any("--seq 512" in s and "Axolotl's default" in s for s in lines(r, "from file"))


@pytest.mark.parametrize("body,key", [
    ("adapter: lora\nload_in_8bit: true\n", "load_in_8bit"),
    ("adapter: lora\nload_in_4bit: true\n", "load_in_4bit"),
    ("adapter: llama-adapter\n", "adapter"),
    ("adapter: lora\nlora_target_modules:\n  - c_attn\n", "lora_target_modules"),
    ("adapter: lora\npeft_use_dora: true\n", "peft_use_dora"),
    ("adapter: lora\nlora_modules_to_save: [embed_tokens]\n", "lora_modules_to_save"),
    ("gradient_checkpointing: offload\n", "gradient_checkpointing"),
    ("activation_offloading: true\n", "activation_offloading"),
    ("attn_implementation: flex_attention\n", "attn_implementation"),
    ("xformers_attention: true\n", "xformers_attention"),
    ("optimizer: ao_adamw_8bit\n", "optimizer"),
    ("torch_compile: true\n", "torch_compile"),
    ("liger_rms_norm: true\n", "liger_rms_norm"),
    ("cut_cross_entropy: true\n", "cut_cross_entropy"),
    ("chunked_cross_entropy: true\n", "chunked_cross_entropy"),
    ("rl: dpo\n", "rl"),
    ("unfrozen_parameters: ['^lm_head.weight$']\n", "unfrozen_parameters"),
    ("context_parallel_size: 2\n", "context_parallel_size"),
    ("fp8: true\n", "fp8"),
])
def test_unmodelled_keys_are_listed_and_warned(tmp_path, body, key):
    path = ax(tmp_path, body)
    assert any(key in line for line in lines(estimate("--from", path), "unmodelled"))
    p = run("fit", MODEL, "--from", path)
    assert p.returncode == 0, p.stderr
    assert key in p.stderr and "not modelled" in p.stderr


def test_memory_neutral_keys_are_ignored(tmp_path):
    body = ("datasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\noutput_dir: ./out\n"
            "learning_rate: 0.0002\nnum_epochs: 3\nwandb_project: p\nsample_packing: true\n"
            "lr_scheduler: cosine\ntf32: true\nlora_alpha: 16\n")
    r = estimate("--from", ax(tmp_path, body))
    assert numbers(r) == numbers(estimate(*S, *DEFAULTS[2:]))
    assert lines(r, "unmodelled") == []


def test_command_line_wins():
    r = estimate("--from", CFG / "axolotl_qlora.yaml", "--seq", 512, "--finetune", "lora",
                 "--precision", "fp16", "--lora-rank", 4)
    want = list(QLORA)
    for flag, value in [("--seq", 512), ("--finetune", "lora"), ("--precision", "fp16"),
                        ("--lora-rank", 4)]:
        want[want.index(flag) + 1] = value
    assert numbers(r) == numbers(estimate(*want))
    assert not any(a["flag"] in ("--seq", "--finetune", "--precision", "--lora-rank")
                   and a["what"] == "from file" for a in r["assumptions"])


def test_deepspeed_path_is_relative_to_the_yaml(tmp_path):
    sub = tmp_path / "cfg"
    sub.mkdir()
    (sub / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 1},
                                             "bf16": {"enabled": "auto"}}))
    path = ax(sub, "deepspeed: ds.json\nmicro_batch_size: 2\n")
    r = estimate("--from", path)
    assert numbers(r) == numbers(estimate(*S, "--optimizer", "adamw-fused", "--precision",
                                          "bf16-mixed", "--batch", 2, "--zero", 1))
    assert any("ds.json: zero_optimization.stage" in s for s in lines(r, "from file"))


def test_any_extension_and_json(tmp_path):
    # Recognised by base_model + an Axolotl key, whatever the name; JSON too.
    c = write(tmp_path, "train_config", "base_model: x\nmicro_batch_size: 2\nsequence_len: 1024\n")
    assert numbers(estimate("--from", c)) == numbers(estimate(*S, *DEFAULTS[2:], "--batch", 2))
    j = write(tmp_path, "ax.json", json.dumps({"base_model": "x", "sequence_len": 1024,
                                               "learning_rate": 1e-4}))
    assert numbers(estimate("--from", j)) == numbers(estimate(*S, *DEFAULTS[2:]))


def test_accelerate_detection_unchanged(tmp_path):
    # A distributed_type makes it an accelerate config even with base_model.
    path = write(tmp_path, "acc.yaml", "base_model: x\nsequence_len: 64\n"
                                       "distributed_type: MULTI_GPU\nnum_processes: 2\n")
    assert numbers(estimate("--from", path)) == numbers(estimate("--gpus", 2, "--ddp"))


@pytest.mark.parametrize("name,text,key", [
    ("broken.yaml", "base_model: x\nsequence_len: [\n", "not valid YAML"),
    ("seq.yaml", "base_model: x\nsequence_len: long\n", "sequence_len"),
    ("seqf.yaml", "base_model: x\nsequence_len: 1.5\n", "sequence_len"),
    ("micro.yaml", "base_model: x\nmicro_batch_size: 0\n", "micro_batch_size"),
    ("both.yaml", "base_model: x\nmicro_batch_size: 2\nbatch_size: 8\n"
                  "gradient_accumulation_steps: 4\n", "batch_size"),
    ("model.yaml", "base_model: [a]\nsequence_len: 8\n", "base_model"),
    ("bf16.yaml", "base_model: x\nsequence_len: 8\nbf16: full\n", "bf16"),
    ("fp16.yaml", "base_model: x\nsequence_len: 8\nfp16: 'yes'\n", "fp16"),
    ("qlora4.yaml", "base_model: x\nadapter: qlora\n", "adapter"),
    ("qlora8.yaml", "base_model: x\nadapter: qlora\nload_in_4bit: true\nload_in_8bit: true\n",
     "load_in_8bit"),
    ("full4.yaml", "base_model: x\nsequence_len: 8\nload_in_4bit: true\n", "load_in_4bit"),
    ("rank.yaml", "base_model: x\nadapter: lora\nlora_r: eight\n", "lora_r"),
    ("drop.yaml", "base_model: x\nadapter: lora\nlora_dropout: 1.5\n", "lora_dropout"),
    ("targets.yaml", "base_model: x\nadapter: lora\nlora_target_modules: 3\n",
     "lora_target_modules"),
    ("ckpt.yaml", "base_model: x\nsequence_len: 8\ngradient_checkpointing: sometimes\n",
     "gradient_checkpointing"),
    ("reent.yaml", "base_model: x\nsequence_len: 8\ngradient_checkpointing: true\n"
                   "gradient_checkpointing_kwargs:\n  use_reentrant: 2\n", "use_reentrant"),
    ("attn.yaml", "base_model: x\nsequence_len: 8\nattn_implementation: sdpa\n"
                  "flash_attention: true\n", "flash_attention"),
    ("optim.yaml", "base_model: x\nsequence_len: 8\noptimizer: [adamw]\n", "optimizer"),
    ("ds.yaml", "base_model: x\nsequence_len: 8\ndeepspeed: 3\n", "deepspeed"),
    ("dsmissing.yaml", "base_model: x\nsequence_len: 8\ndeepspeed: nowhere/ds.json\n",
     "deepspeed"),
    # A path with a line break and an escape (found by fuzz_accelerate_yaml): quoted.
    ("dsctrl.yaml", "base_model: x\nsequence_len: 8\ndeepspeed: \"ds\\n\\u001b[2J.json\"\n",
     "deepspeed"),
    ("dsfsdp.yaml", "base_model: x\nsequence_len: 8\ndeepspeed: {}\nfsdp_config:\n"
                    "  offload_params: true\n", "deepspeed"),
    ("fsdpver.yaml", "base_model: x\nsequence_len: 8\nfsdp_version: 3\nfsdp_config:\n"
                     "  offload_params: true\n",
     "fsdp_version"),
    ("fsdpcfg.yaml", "base_model: x\nsequence_len: 8\nfsdp_config: [1]\n", "fsdp_config"),
    ("fsdpopt.yaml", "base_model: x\nsequence_len: 8\nfsdp: [sideways]\n", "fsdp"),
])
def test_malformed_file_is_one_line_naming_file_and_key(tmp_path, name, text, key):
    path = write(tmp_path, name, text)
    p = run("estimate", MODEL, "--from", path)
    assert p.returncode == 2, p.stderr
    out = p.stderr.strip().splitlines()
    assert len(out) == 1, p.stderr
    assert out[0].startswith("vramscope: error: "), out
    assert name in out[0] and key in out[0], out


def test_fit_sweep_plan_accept_axolotl():
    f = CFG / "axolotl_qlora.yaml"
    p = run("fit", MODEL, "--from", f, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == json.loads(run("fit", MODEL, *QLORA, "--json").stdout)
    p = run("sweep", MODEL, "--from", f, "--seq", "512,1024", "--json")
    assert p.returncode == 0, p.stderr
    p = run("plan", MODEL, "--from", f, "--json", timeout=300)
    assert p.returncode == 0, p.stderr
