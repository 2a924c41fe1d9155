"""--from FILE: Hugging Face accelerate's config YAML (docs/configs.md).

Each example accelerate config in examples/configs/ must give, number for
number, the report of the flags it stands for; each mapped key is checked on
its own; a flag on the command line wins; a malformed file is one line naming
the file (and the key), exit 2.
"""
import json

import pytest

from from_file_helpers import CFG, MODEL, run, estimate, numbers, lines, write


ACC_FSDP = ["--gpus", 8, "--precision", "bf16-mixed", "--fsdp", "full", "--fsdp-version", 2,
            "--grad-ckpt", "full"]
ACC_DS = ["--gpus", 16, "--gpus-per-node", 8, "--precision", "bf16-mixed", "--zero", 3,
          "--offload", "params", "--grad-accum", 4]
DS_ZERO3 = ["--gpus", 8, "--batch", 2, "--grad-accum", 4, "--precision", "bf16-mixed",
            "--optimizer", "adamw-fused", "--zero", 3, "--offload", "params",
            "--zero-reduce-bucket-size", 200000000, "--zero-prefetch-bucket-size", 40000000,
            "--zero-persistence-threshold", 100000, "--zero-max-live-parameters", 1000000000,
            "--zero-max-reuse-distance", 1000000000, "--zero-sub-group-size", 1000000000]


@pytest.mark.parametrize("file,flags", [
    ("accelerate_fsdp.yaml", ACC_FSDP),
    ("accelerate_deepspeed.yaml", ACC_DS),
    ("accelerate_ds_file.yaml", DS_ZERO3),
])
def test_example_equals_its_flags(file, flags):
    from_file = estimate("--from", CFG / file)
    assert numbers(from_file) == numbers(estimate(*flags))
    sources = lines(from_file, "from file")
    assert sources and all(file in s or "ds_zero3_offload.json" in s for s in sources), sources


def test_from_file_lines_name_the_accelerate_keys():
    r = estimate("--from", CFG / "accelerate_deepspeed.yaml")
    got = lines(r, "from file")
    for want in ["--gpus 16 (from", "num_processes)", "--gpus-per-node 8",
                 "--zero 3 (from", "deepspeed_config.zero_stage)",
                 "deepspeed_config.offload_param_device)",
                 "deepspeed_config.gradient_accumulation_steps)", "mixed_precision)"]:
        assert any(want in line for line in got), (want, got)


def acc(tmp_path, body, name="acc.yaml"):
    return write(tmp_path, name, "compute_environment: LOCAL_MACHINE\n" + body)


@pytest.mark.parametrize("body,flags", [
    ("distributed_type: 'NO'\nmixed_precision: 'no'\n", ["--precision", "fp32"]),
    ("distributed_type: 'NO'\nmixed_precision: fp16\n", ["--precision", "fp16-mixed"]),
    ("distributed_type: 'NO'\nmixed_precision: BF16\n", ["--precision", "bf16-mixed"]),
    ("distributed_type: 'NO'\nfp16: true\n", ["--precision", "fp16-mixed"]),
    ("distributed_type: MULTI_GPU\nnum_processes: 4\n", ["--gpus", 4, "--ddp"]),
    ("distributed_type: MULTI_GPU\nnum_processes: 16\nnum_machines: 2\n",
     ["--gpus", 16, "--gpus-per-node", 8, "--ddp"]),
    ("distributed_type: MULTI_GPU\nnum_processes: -1\n", ["--ddp"]),
    ("distributed_type: FSDP\nnum_processes: 4\n", ["--gpus", 4, "--fsdp", "full",
                                                      "--fsdp-version", 1]),
    ("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n  fsdp_version: 1\n"
     "  fsdp_sharding_strategy: SHARD_GRAD_OP\n",
     ["--gpus", 4, "--fsdp", "grad-op", "--fsdp-version", 1]),
    ("distributed_type: FSDP\nnum_processes: 16\nnum_machines: 2\nfsdp_config:\n"
     "  fsdp_sharding_strategy: 4\n",
     ["--gpus", 16, "--gpus-per-node", 8, "--fsdp", "hybrid", "--fsdp-version", 1]),
    ("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n"
     "  fsdp_reshard_after_forward: SHARD_GRAD_OP\n  fsdp_offload_params: true\n",
     # FSDP1: accelerate launch exports FSDP_SHARDING_STRATEGY=FULL_SHARD (no
     # fsdp_sharding_strategy in the file), which the plugin takes first.
     ["--gpus", 4, "--fsdp", "full", "--fsdp-version", 1, "--offload", "params"]),
    ("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n  fsdp_version: 2\n"
     "  fsdp_reshard_after_forward: false\n  fsdp_activation_checkpointing: 'true'\n",
     ["--gpus", 4, "--fsdp", "grad-op", "--fsdp-version", 2, "--grad-ckpt", "full"]),
    ("distributed_type: DEEPSPEED\nnum_processes: 4\n", ["--gpus", 4, "--zero", 2]),
    ("distributed_type: DEEPSPEED\nnum_processes: 4\ndeepspeed_config:\n  zero_stage: 1\n"
     "  offload_optimizer_device: cpu\n",
     ["--gpus", 4, "--zero", 1, "--offload", "optimizer"]),
])
def test_each_key_maps_to_its_flag(tmp_path, body, flags):
    assert numbers(estimate("--from", acc(tmp_path, body))) == numbers(estimate(*flags))


@pytest.mark.parametrize("body,key", [
    ("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n"
     "  fsdp_activation_checkpointing: true\n  fsdp_activation_checkpointing_offload: true\n"
     "  fsdp_version: 2\n", "fsdp_activation_checkpointing_offload"),
    ("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n"
     "  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n", "fsdp_auto_wrap_policy"),
    ("distributed_type: FSDP\nnum_processes: 4\nfsdp_config:\n"
     "  fsdp_sharding_strategy: HYBRID_SHARD_ZERO2\n", "hybrid_shard_zero2"),
    ("distributed_type: 'NO'\nmixed_precision: fp8\n", "mixed_precision"),
    ("distributed_type: 'NO'\ndynamo_config:\n  dynamo_backend: INDUCTOR\n", "dynamo_backend"),
    ("distributed_type: MULTI_XPU\nnum_processes: 2\n", "distributed_type"),
    ("distributed_type: DEEPSPEED\nnum_processes: 4\ndeepspeed_config:\n  zero_stage: 2\n"
     "  offload_param_device: cpu\n", "deepspeed_config.offload_param_device"),
])
def test_unmodelled_keys_are_listed_and_warned(tmp_path, body, key):
    path = acc(tmp_path, body)
    assert any(key in line for line in lines(estimate("--from", path), "unmodelled"))
    p = run("fit", MODEL, "--from", path)
    assert p.returncode == 0, p.stderr
    assert key in p.stderr and "not modelled" in p.stderr


def test_command_line_wins():
    r = estimate("--from", CFG / "accelerate_fsdp.yaml", "--gpus", 4, "--precision", "fp32",
                 "--zero", 2)
    assert numbers(r) == numbers(estimate("--gpus", 4, "--precision", "fp32", "--zero", 2,
                                          "--grad-ckpt", "full", "--fsdp-version", 2))
    assert not any(a["flag"] in ("--gpus", "--precision", "--fsdp") and a["what"] == "from file"
                   for a in r["assumptions"])


def test_later_file_mode_replaces_earlier(tmp_path):
    # MULTI_GPU's --ddp after an FSDP file: one data-parallel mode, DDP.
    ddp = acc(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 8\n", "ddp.yaml")
    r = estimate("--from", CFG / "accelerate_fsdp.yaml", "--from", ddp)
    assert numbers(r) == numbers(estimate("--gpus", 8, "--ddp", "--precision", "bf16-mixed",
                                          "--grad-ckpt", "full", "--fsdp-version", 2))


def test_accelerate_json_config_and_any_extension(tmp_path):
    # accelerate also reads a .json config; a YAML file named otherwise is
    # recognised by distributed_type / compute_environment.
    j = write(tmp_path, "acc.json", json.dumps({"distributed_type": "MULTI_GPU",
                                                "num_processes": 2}))
    assert numbers(estimate("--from", j)) == numbers(estimate("--gpus", 2, "--ddp"))
    c = write(tmp_path, "default_config", "distributed_type: MULTI_GPU\nnum_processes: 2\n")
    assert numbers(estimate("--from", c)) == numbers(estimate("--gpus", 2, "--ddp"))


def test_deepspeed_config_file_is_relative_to_the_yaml(tmp_path):
    sub = tmp_path / "cfg"
    sub.mkdir()
    (sub / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 1},
                                             "train_micro_batch_size_per_gpu": 3}))
    path = acc(sub, "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n"
                    "  deepspeed_config_file: ds.json\n")
    r = estimate("--from", path)
    assert numbers(r) == numbers(estimate("--gpus", 2, "--zero", 1, "--batch", 3))
    assert any("ds.json: zero_optimization.stage" in s for s in lines(r, "from file"))


@pytest.mark.parametrize("name,text,key", [
    ("broken.yaml", "distributed_type: [\n", "not valid YAML"),
    ("anchor.yaml", "distributed_type: &t NO\nx: *t\n", "anchor"),
    ("alias.yaml", "distributed_type: 'NO'\nx: *t\n", "alias"),
    ("tag.yaml", "distributed_type: !!str NO\n", "tag"),
    ("unquoted.yaml", "distributed_type: NO\n", "write 'NO'"),
    ("unquotedmp.yaml", "distributed_type: 'NO'\nmixed_precision: no\n", "mixed_precision"),
    ("twodocs.yaml", "distributed_type: 'NO'\n---\ndistributed_type: 'NO'\n", "second document"),
    ("nul.yaml", b"distributed_type: 'NO'\n\x00", "NUL"),
    ("deep.yaml", "distributed_type: 'NO'\nx: " + "[" * 70 + "]" * 70 + "\n", "nested deeper"),
    ("list.yaml", "- 1\n- 2\n", "not a YAML mapping"),
    ("notype.yaml", "compute_environment: LOCAL_MACHINE\n", "distributed_type"),
    ("sagemaker.yaml", "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: 'NO'\n",
     "compute_environment"),
    ("badtype.yaml", "distributed_type: SIDEWAYS\n", "distributed_type"),
    ("badmp.yaml", "distributed_type: 'NO'\nmixed_precision: fp4\n", "mixed_precision"),
    ("procs.yaml", "distributed_type: MULTI_GPU\nnum_processes: two\n", "num_processes"),
    ("octal.yaml", "distributed_type: MULTI_GPU\nnum_processes: 010\n", "num_processes"),
    ("procs0.yaml", "distributed_type: MULTI_GPU\nnum_processes: 0\n", "num_processes"),
    ("machines.yaml", "distributed_type: MULTI_GPU\nnum_processes: 9\nnum_machines: 2\n",
     "num_processes"),
    ("stage.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 7\n",
     "deepspeed_config.zero_stage"),
    ("device.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                    "  offload_optimizer_device: tape\n", "deepspeed_config.offload_optimizer_device"),
    ("accum.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                   "  gradient_accumulation_steps: 1.5\n", "deepspeed_config.gradient_accumulation_steps"),
    ("dsboth.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n"
                    "  deepspeed_config_file: ds.json\n", "deepspeed_config.zero_stage"),
    ("dsmp.yaml", "distributed_type: DEEPSPEED\nmixed_precision: bf16\ndeepspeed_config:\n"
                  "  deepspeed_config_file: ds.json\n", "mixed_precision"),
    ("dsmissing.yaml", "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                       "  deepspeed_config_file: nowhere/ds.json\n", "deepspeed_config_file"),
    ("strategy.yaml", "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: SIDEWAYS\n",
     "fsdp_config.fsdp_sharding_strategy"),
    ("raf2.yaml", "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
                  "  fsdp_reshard_after_forward: maybe\n", "fsdp_config.fsdp_reshard_after_forward"),
    ("version.yaml", "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 3\n",
     "fsdp_config.fsdp_version"),
    ("offload.yaml", "distributed_type: FSDP\nfsdp_config:\n  fsdp_offload_params: 2\n",
     "fsdp_config.fsdp_offload_params"),
    ("fsdpcfg.yaml", "distributed_type: FSDP\nfsdp_config: [1]\n", "fsdp_config"),
])
def test_malformed_file_is_one_line_naming_file_and_key(tmp_path, name, text, key):
    path = write(tmp_path, name, text)
    p = run("estimate", MODEL, "--from", path)
    assert p.returncode == 2, p.stderr
    out = p.stderr.strip().splitlines()
    assert len(out) == 1, p.stderr
    assert out[0].startswith("vramscope: error: "), out
    assert name in out[0] and key in out[0], out


def test_too_big_yaml_is_refused(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("distributed_type: 'NO'\npad: " + "x" * (17 << 20) + "\n")
    p = run("estimate", MODEL, "--from", path)
    assert p.returncode == 2
    assert "big.yaml" in p.stderr and "limit" in p.stderr and len(p.stderr.splitlines()) == 1


def test_fit_sweep_plan_accept_accelerate():
    f = CFG / "accelerate_fsdp.yaml"
    p = run("fit", MODEL, "--from", f, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == json.loads(run("fit", MODEL, *ACC_FSDP, "--json").stdout)
    p = run("sweep", MODEL, "--from", f, "--seq", "512,1024", "--json")
    assert p.returncode == 0, p.stderr
    p = run("plan", MODEL, "--from", f, "--json", timeout=300)
    assert p.returncode == 0, p.stderr
