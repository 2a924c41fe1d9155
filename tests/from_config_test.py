"""--from FILE: DeepSpeed config and HF TrainingArguments JSON (docs/configs.md).

Each example file in examples/configs/ must give, number for number, the
report of the flags it stands for; a flag on the command line wins over the
file; a malformed file is one line naming the file and the key, exit 2.
"""
import json

import pytest

from from_file_helpers import CFG, MODEL, run, estimate, numbers, write


DS_ZERO3 = ["--gpus", 8, "--batch", 2, "--grad-accum", 4, "--precision", "bf16-mixed",
            "--optimizer", "adamw-fused", "--zero", 3, "--offload", "params",
            "--zero-reduce-bucket-size", 200000000, "--zero-prefetch-bucket-size", 40000000,
            "--zero-persistence-threshold", 100000, "--zero-max-live-parameters", 1000000000,
            "--zero-max-reuse-distance", 1000000000, "--zero-sub-group-size", 1000000000]
# ds_zero2_auto.json through hf_training_args.json: "auto" sizes are HF's,
# the auto-able sizes the file leaves out keep DeepSpeed's defaults.
HF_DS = ["--batch", 4, "--grad-accum", 8, "--precision", "bf16-mixed", "--grad-ckpt", "full",
         "--optimizer", "adamw-fused", "--zero", 2, "--zero-buckets", "hf-auto",
         "--zero-prefetch-bucket-size", 50000000, "--zero-persistence-threshold", 100000,
         "--zero-overlap-comm", "on"]  # ds_zero2_auto.json: overlap_comm true
HF_FSDP = ["--batch", 1, "--grad-accum", 16, "--precision", "bf16-mixed", "--grad-ckpt", "full",
           "--optimizer", "adamw", "--fsdp", "full", "--fsdp-version", 2]


@pytest.mark.parametrize("file,extra,flags", [
    ("ds_zero3_offload.json", [], DS_ZERO3),
    ("hf_training_args.json", ["--gpus", 8], ["--gpus", 8] + HF_DS),
    ("hf_fsdp.json", ["--gpus", 8], ["--gpus", 8] + HF_FSDP),
])
def test_file_equals_its_flags(file, extra, flags):
    from_file = estimate("--from", CFG / file, *extra)
    from_flags = estimate(*flags)
    assert numbers(from_file) == numbers(from_flags)
    sources = [a["assumed"] for a in from_file["assumptions"] if a["what"] == "from file"]
    assert sources and all(file in s or "ds_zero2_auto.json" in s for s in sources)


def test_not_modelled_keys_are_listed():
    r = estimate("--from", CFG / "ds_zero3_offload.json")
    lines = [a["assumed"] for a in r["assumptions"] if a["what"] == "unmodelled"]
    assert any("activation_checkpointing.cpu_checkpointing" in l for l in lines), lines
    r = estimate("--from", CFG / "hf_fsdp.json", "--gpus", 8)
    assert any("torch_compile" in a["assumed"] for a in r["assumptions"])


def test_explicit_flag_overrides_the_file():
    overridden = estimate("--from", CFG / "ds_zero3_offload.json", "--batch", 1,
                          "--precision", "fp16-mixed")
    flags = list(DS_ZERO3)
    flags[flags.index("--batch") + 1] = 1
    flags[flags.index("--precision") + 1] = "fp16-mixed"
    assert numbers(overridden) == numbers(estimate(*flags))
    assert not any(a["flag"] == "--batch" and a["what"] == "from file"
                   for a in overridden["assumptions"])


def test_later_file_wins_and_mode_flag_overrides():
    # The second file's ZeRO stage replaces the first file's FSDP (one mode);
    # the first file's checkpointing stays.
    both = estimate("--from", CFG / "hf_fsdp.json", "--from", CFG / "ds_zero3_offload.json")
    flags = estimate(*DS_ZERO3, "--grad-ckpt", "full", "--fsdp-version", 2)
    assert numbers(both) == numbers(flags)
    # --ddp on the command line replaces the file's ZeRO stage.
    assert numbers(estimate("--from", CFG / "ds_zero2_auto.json", "--gpus", 2, "--ddp")) == \
        numbers(estimate("--gpus", 2, "--ddp", "--optimizer", "adamw-fused",
                         "--zero-buckets", "hf-auto", "--zero-prefetch-bucket-size", 50000000,
                         "--zero-persistence-threshold", 100000))


@pytest.mark.parametrize("name,text,key", [
    ("notjson.json", "{ zero_optimization: ", "not valid JSON"),
    ("stage7.json", '{"zero_optimization": {"stage": 7}}', "zero_optimization.stage"),
    ("batchx.json", '{"train_micro_batch_size_per_gpu": "x"}', "train_micro_batch_size_per_gpu"),
    ("tape.json", '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "tape"}}}',
     "zero_optimization.offload_optimizer.device"),
    ("dsmissing.json", '{"per_device_train_batch_size": 1, "deepspeed": "nowhere/ds.json"}',
     "deepspeed"),
    ("nul.json", b'{"train_micro_batch_size_per_gpu": 1}\x00', "NUL"),
    ("hfbatch.json", '{"per_device_train_batch_size": 1.5}', "per_device_train_batch_size"),
    ("bothprec.json", '{"bf16": true, "fp16": true, "output_dir": "x"}', "bf16"),
    ("fsdpbad.json", '{"output_dir": "x", "fsdp": "full_shard sideways"}', "fsdp"),
    ("neither.json", '{"hello": 1}', "neither"),
    ("array.json", '[1, 2]', "not a JSON object"),
])
def test_malformed_file_is_one_line_naming_file_and_key(tmp_path, name, text, key):
    path = write(tmp_path, name, text)
    p = run("estimate", MODEL, "--from", path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("vramscope: error: "), lines
    assert name in lines[0] and key in lines[0], lines


def test_too_big_file_is_refused(tmp_path):
    path = tmp_path / "big.json"
    path.write_text('{"zero_optimization": {"stage": 3}, "pad": "' + "x" * (17 << 20) + '"}')
    p = run("estimate", MODEL, "--from", path)
    assert p.returncode == 2
    assert "big.json" in p.stderr and "limit" in p.stderr and len(p.stderr.splitlines()) == 1


def test_missing_file(tmp_path):
    p = run("estimate", MODEL, "--from", tmp_path / "absent.json")
    assert p.returncode == 2 and "absent.json: no such file" in p.stderr


def test_fit_sweep_plan_accept_from():
    ds = CFG / "ds_zero3_offload.json"
    p = run("fit", MODEL, "--from", ds, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == json.loads(run("fit", MODEL, *DS_ZERO3, "--json").stdout)
    p = run("sweep", MODEL, "--from", ds, "--seq", "512,1024", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == json.loads(
        run("sweep", MODEL, *DS_ZERO3, "--seq", "512,1024", "--json").stdout)
    p = run("plan", MODEL, "--from", CFG / "hf_fsdp.json", "--gpus", 8, "--json", timeout=300)
    assert p.returncode == 0, p.stderr


def test_help_mentions_from():
    for cmd in ("estimate", "fit", "sweep", "plan"):
        assert "--from" in run(cmd, "--help").stdout


def test_hf_checkpointing_default_follows_transformers_version():
    # No use_reentrant: reentrant in transformers 4.35-4.57, non-reentrant in 5.x.
    old = estimate("--from", CFG / "hf_fsdp.json", "--gpus", 8, "--transformers-version", "4.57")
    flags = ["--gpus", 8] + HF_FSDP + ["--transformers-version", "4.57"]
    flags[flags.index("--grad-ckpt") + 1] = "reentrant"
    assert numbers(old) == numbers(estimate(*flags))


def test_unmodelled_keys_warn_on_every_command():
    p = run("fit", MODEL, "--from", CFG / "ds_zero3_offload.json")
    assert p.returncode == 0, p.stderr
    assert "activation_checkpointing.cpu_checkpointing" in p.stderr and "not modelled" in p.stderr


def test_hf_fsdp_true_with_the_sharding_in_fsdp_config(tmp_path):
    # transformers 5.x: fsdp=true, fsdp_config.reshard_after_forward false is
    # shard_grad_op under FSDP2 (the 5.x default version), cpu_offload offloads.
    path = write(tmp_path, "fsdp5.json", json.dumps({
        "output_dir": "x", "fsdp": True,
        "fsdp_config": {"reshard_after_forward": False, "cpu_offload": True}}))
    assert numbers(estimate("--from", path, "--gpus", 4)) == numbers(estimate(
        "--gpus", 4, "--fsdp", "grad-op", "--offload", "params", "--fsdp-version", 2))


def test_hf_fsdp_version_default_follows_transformers_version(tmp_path):
    # 4.57 leaves the version to accelerate (FSDP1 by default); 5.x defaults to 2.
    path = write(tmp_path, "fsdp4.json", json.dumps({"output_dir": "x", "fsdp": "full_shard"}))
    old = estimate("--from", path, "--gpus", 4, "--transformers-version", "4.57")
    assert numbers(old) == numbers(estimate("--gpus", 4, "--fsdp", "full", "--fsdp-version", 1,
                                            "--transformers-version", "4.57"))
    assert numbers(estimate("--from", path, "--gpus", 4)) == numbers(
        estimate("--gpus", 4, "--fsdp", "full", "--fsdp-version", 2))


@pytest.mark.parametrize("optim,optim_args,flag", [
    ("adamw_torch", None, "adamw"), ("adamw_torch_fused", None, "adamw-fused"),
    ("adamw_8bit", None, "adamw-8bit"), ("paged_adamw_8bit", None, "paged-adamw-8bit"),
    ("adafactor", None, "adafactor"), ("sgd", None, "sgd"),
    ("sgd", "momentum=0.9,nesterov=True", "sgd-momentum"),
])
def test_hf_optim_names(tmp_path, optim, optim_args, flag):
    path = write(tmp_path, "optim.json", json.dumps(
        {"output_dir": "x", "optim": optim, "optim_args": optim_args}))
    assert numbers(estimate("--from", path)) == numbers(estimate("--optimizer", flag))


def test_bf16_alone_is_the_default_precision(tmp_path):
    # Trainer(bf16=True) autocasts over what from_pretrained loaded: the checkpoint's
    # bfloat16 under transformers 5, float32 under 4.x (issue 40: the default precision).
    path = write(tmp_path, "args.json", '{"bf16": true, "output_dir": "x"}')
    assert numbers(estimate("--from", path)) == numbers(estimate("--precision", "bf16"))
    assert numbers(estimate("--from", path, "--transformers-version", "4.57")) == numbers(
        estimate("--precision", "bf16-mixed", "--transformers-version", "4.57"))
