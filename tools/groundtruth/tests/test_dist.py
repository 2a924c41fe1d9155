"""Data-parallel knobs (world size 1) and the plan's `dist` part: pure Python, no torch."""

import pytest

from gtlib import grid, knobs, models, plan

BASE = {"model": "tiny-llama", "seq": 128, "batch": 2}


def norm(**raw):
    return knobs.normalize_knobs({**BASE, **raw})


def make(model_dirs, **raw):
    k = norm(**raw)
    return plan.make_plan(k, models.resolve_model(k["model"], model_dirs).config)


def test_knobs_appear_only_with_a_library_so_old_ids_stay():
    plain = norm()
    assert not set(knobs.DIST_KNOBS) & set(plain)
    assert norm(gpus=1) == plain  # one GPU, no library: the default
    assert norm(ddp=False) == plain
    # A committed record's id (data/groundtruth, round 2) is unchanged by the new knobs.
    k = knobs.normalize_knobs({"model": "falcon-7b", "batch": 1, "seq": 2048, "precision": "bf16",
                               "finetune": "lora", "lora_targets": "all-linear",
                               "grad_ckpt": "full"})
    assert knobs.config_id(k) == "a78c20bef58e"


@pytest.mark.parametrize("raw, expected", [
    (dict(ddp=True), {"gpus": 1, "ddp": True}),
    (dict(zero=2), {"gpus": 1, "zero": 2, "offload": "none", "zero_buckets": "deepspeed"}),
    (dict(zero=3, offload="params", zero_buckets="hf-auto"),
     {"gpus": 1, "zero": 3, "offload": "params", "no_zero_init": False,
      "zero_buckets": "hf-auto"}),
    (dict(fsdp="full"), {"gpus": 1, "fsdp": "full", "offload": "none", "fsdp_version": 2,
                         "fsdp_wrap": "trainer"}),
    (dict(fsdp="grad-op", fsdp_version=1),
     {"gpus": 1, "fsdp": "grad-op", "offload": "none", "fsdp_version": 1,
      "fsdp_wrap": "trainer", "fsdp_backward_prefetch": "none"}),
])
def test_canonical_dist_knobs(raw, expected):
    k = norm(**raw)
    assert {n: k[n] for n in knobs.DIST_KNOBS if n in k} == expected
    assert list(k) == [n for n in knobs.KNOB_ORDER if n in k]
    assert knobs.normalize_knobs(k) == k  # canonical is a fixed point (schema checks it)


@pytest.mark.parametrize("raw, message", [
    (dict(gpus=2, ddp=True), "world size 1"),
    (dict(zero=1, fsdp="full"), "one data-parallel library"),
    (dict(zero=4), "1, 2 or 3"),
    (dict(zero=True), "1, 2 or 3"),
    (dict(zero=2, offload="params"), "only with zero = 3"),
    (dict(zero=2, no_zero_init=True), "zero = 3 only"),
    (dict(ddp=True, offload="optimizer"), "do not apply to ddp"),
    (dict(offload="optimizer"), "need a data-parallel library"),
    (dict(fsdp="hybrid"), "full, grad-op"),
    (dict(fsdp="full", fsdp_backward_prefetch="pre"), "FSDP1's"),
    (dict(fsdp="full", zero_buckets="hf-auto"), "do not apply to fsdp"),
    (dict(ddp="yes"), "true or false"),
])
def test_dist_knob_errors(raw, message):
    with pytest.raises(knobs.KnobError, match=message):
        norm(**raw)


def test_estimate_flags_mirror_the_cli():
    flags = knobs.estimate_flags(norm(zero=3, no_zero_init=True, zero_buckets="hf-auto"))
    assert flags[flags.index("--gpus"):flags.index("--steps")] == [
        "--gpus", "1", "--zero", "3", "--no-zero-init", "--zero-buckets", "hf-auto"]
    flags = knobs.estimate_flags(norm(ddp=True))
    assert flags[flags.index("--gpus"):flags.index("--steps")] == ["--gpus", "1", "--ddp"]
    flags = knobs.estimate_flags(norm(fsdp="full", fsdp_version=1, fsdp_backward_prefetch="pre",
                                      offload="params"))
    assert flags[flags.index("--gpus"):flags.index("--steps")] == [
        "--gpus", "1", "--offload", "params", "--fsdp", "full", "--fsdp-version", "1",
        "--fsdp-wrap", "trainer", "--fsdp-backward-prefetch", "pre"]


def test_deepspeed_plan_hf_auto_buckets_offload_and_zero_init(model_dirs):
    p = make(model_dirs, zero=3, zero_buckets="hf-auto", offload="params")
    hidden = 64  # tests/data/models/tiny-llama.json
    ds = p["dist"]["deepspeed"]
    assert ds["zero_init"] is True
    zero = ds["config"]["zero_optimization"]
    assert zero == {"stage": 3, "reduce_bucket_size": hidden * hidden,
                    "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                    "stage3_param_persistence_threshold": 10 * hidden,
                    "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    assert ds["config"]["optimizer"]["params"]["torch_adam"] is True
    assert ds["config"]["zero_force_ds_cpu_optimizer"] is False
    assert ds["config"]["bf16"] == {"enabled": True}
    # The engine casts the module and owns the optimizer: no autocast, no separate optimizer.
    assert p["precision"]["autocast_dtype"] is None and p["optimizer"] is None
    assert p["build"]["device"] == "cpu" and "deepspeed" in p["requires"]


def test_deepspeed_plan_defaults(model_dirs):
    p = make(model_dirs, zero=1, precision="fp32", optimizer="adamw-fused")
    config = p["dist"]["deepspeed"]["config"]
    assert config["zero_optimization"] == {"stage": 1}
    assert config["optimizer"]["params"] == {"lr": plan.LEARNING_RATE, "torch_adam": True,
                                             "fused": True}
    assert "bf16" not in config and "zero_force_ds_cpu_optimizer" not in config
    assert make(model_dirs, zero=3, no_zero_init=True)["dist"]["deepspeed"]["zero_init"] is False


def test_fsdp_plan_is_the_trainers_plugin(model_dirs):
    p1 = make(model_dirs, fsdp="full", fsdp_version=1, finetune="lora")["dist"]["fsdp"]
    assert p1["plugin"] == {
        "fsdp_version": 1, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "cpu_ram_efficient_loading": False, "state_dict_type": "FULL_STATE_DICT",
        "reshard_after_forward": "full_shard", "forward_prefetch": False,
        "backward_prefetch": "NO_PREFETCH", "use_orig_params": True, "sync_module_states": True}
    assert p1["update_fsdp_plugin_peft"] is True and p1["mixed_precision"] == "bf16"
    p2 = make(model_dirs, fsdp="grad-op", finetune="lora")
    assert p2["dist"]["fsdp"]["plugin"]["reshard_after_forward"] is False
    # transformers 5.x Trainer: FSDP2 never calls update_fsdp_plugin_peft.
    assert p2["dist"]["fsdp"]["update_fsdp_plugin_peft"] is False
    assert p2["precision"]["autocast_dtype"] is None  # accelerate's forward autocasts
    assert "accelerate" in p2["requires"]
    by_hand = make(model_dirs, fsdp="full", fsdp_wrap="layers", precision="bf16")
    assert by_hand["dist"]["fsdp"]["wrapper"] == "fully_shard"
    assert "accelerate" not in by_hand["requires"]


def test_ddp_plan_keeps_autocast_and_the_optimizer(model_dirs):
    p = make(model_dirs, ddp=True)
    assert p["dist"]["ddp"] == {"device_ids": [0], "bucket_cap_mb": 25,
                                "gradient_as_bucket_view": False}
    assert p["precision"]["autocast_dtype"] == "bfloat16"
    assert p["optimizer"]["class"] == "AdamW"


@pytest.mark.parametrize("raw, message", [
    (dict(zero=2, finetune="qlora"), "qlora"),
    (dict(zero=2, grad_accum=2), "grad_accum"),
    (dict(fsdp="full", loss="chunked"), "loss chunked"),
    (dict(zero=2, precision="fp16-mixed"), "fp16"),
    (dict(zero=2, optimizer="sgd"), "config's AdamW"),
    (dict(ddp=True, optimizer="adamw-8bit"), "not driven"),
    (dict(fsdp="full", optimizer="none"), "without an optimizer"),
    (dict(fsdp="full", fsdp_wrap="layers"), "bf16-mixed"),
    (dict(fsdp="full", fsdp_wrap="layers", precision="fp32", offload="optimizer"), "offload"),
])
def test_dist_skips(model_dirs, raw, message):
    with pytest.raises(plan.PlanSkip, match=message):
        make(model_dirs, **raw)


def test_masked_lm_under_a_library_is_skipped(model_dirs):
    with pytest.raises(plan.PlanSkip, match="masked-lm"):
        make(model_dirs, model="tiny-bert", ddp=True)


def test_dist_grid_covers_the_issue(model_dirs):
    """grids/dist-ws1.toml: ZeRO-1/2/3 (± offload, ± zero.Init), FSDP1/2 (full, LoRA), DDP."""
    from conftest import TOOL_DIR
    configs = grid.load_grid(TOOL_DIR / "grids" / "dist-ws1.toml")
    ks = [c.knobs for c in configs]
    assert {k.get("zero") for k in ks} >= {1, 2, 3}
    zero3 = [k for k in ks if k.get("zero") == 3]
    assert {k["offload"] for k in zero3} == {"none", "optimizer", "params"}
    assert {k["no_zero_init"] for k in zero3} == {False, True}
    fsdp = {(k["fsdp_version"], k["finetune"]) for k in ks if "fsdp" in k}
    assert fsdp >= {(1, "full"), (1, "lora"), (2, "full"), (2, "lora")}
    assert any(k.get("ddp") for k in ks)
    assert 15 <= len(configs) <= 24  # sized for about 4 minutes on an H100
    for c in configs:  # every one has a plan (nothing the harness would skip)
        plan.make_plan(c.knobs, models.resolve_model(c.knobs["model"]).config)
