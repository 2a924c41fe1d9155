"""Data-parallel knobs -> the plan's `dist` part: one rank (world size 1) of DDP, DeepSpeed or FSDP.

On one GPU the libraries still run their real CUDA-side machinery: side streams,
`record_stream`, prefetch, reduce buckets, offload copies and NCCL's own
buffers. The plan says exactly what the worker calls (gtlib/dist_run.py), the
way each library's users call it:

  * DDP: the model built on the CPU, moved with `.to("cuda")` (what the HF
    Trainer's `_move_model_to_device` does), then
    `DistributedDataParallel(model, device_ids=[0])` with torch's defaults
    (bucket_cap_mb 25, gradient_as_bucket_view False: `--ddp`'s defaults).
  * DeepSpeed: `deepspeed.initialize(model=, model_parameters=, config=dict)`,
    loop `engine(**batch).loss; engine.backward(loss); engine.step()`. The
    optimizer is the config's "AdamW" with `"torch_adam": true`, i.e. a
    `torch.optim.AdamW` (deepspeed 0.19.8 engine.py `get_optimizer_configuration`):
    DeepSpeed's FusedAdam / DeepSpeedCPUAdam are JIT-built C++/CUDA ops, and the
    device image is not known to have nvcc. ZeRO-3 with `zero.Init` builds the
    model while a `transformers.integrations.HfDeepSpeedConfig` is alive, so
    `from_config` enters `deepspeed.zero.Init` itself (transformers 5.17 / 5.24
    modeling_utils.py `_from_config`: `is_deepspeed_zero3_enabled()`), as
    `from_pretrained` does for Trainer users.
  * FSDP through accelerate, as the HF Trainer configures it: the plugin
    arguments of `TrainingArguments._process_fsdp_args` (transformers 5.17 and
    5.24 identical), `Accelerator(mixed_precision=, fsdp_plugin=)`, and the
    Trainer's order (`Trainer._prepare_for_training`): FSDP1 prepares the model
    first (PEFT models get `update_fsdp_plugin_peft` before) and builds the
    optimizer on the prepared model; FSDP2 builds the optimizer first and calls
    `accelerator.prepare(model, optimizer)`, without `update_fsdp_plugin_peft`.
    `fsdp_wrap = "layers"`: `fully_shard` (FSDP2) / `FullyShardedDataParallel`
    (FSDP1) by hand on each decoder layer, then the root, no accelerate.

Pure Python: no torch import. Raises plan.PlanSkip for what the harness does
not drive yet.
"""

from __future__ import annotations

from .plan import LEARNING_RATE, PlanSkip

BACKEND_GPU = "nccl"
# The optimizer knob -> the DeepSpeed config's AdamW params (torch_adam: torch.optim.AdamW
# with these keyword arguments; deepspeed 0.19.8 engine.py get_optimizer_configuration
# pops `foreach`, the rest reaches AdamW as is).
DEEPSPEED_ADAMW = {
    "adamw": {},
    "adamw-foreach": {"foreach": True},
    "adamw-fused": {"fused": True},
    "adamw-forloop": {"foreach": False},
}
TORCH_OPTIMIZERS = ("none", "sgd", "sgd-momentum", "adamw", "adamw-foreach", "adamw-fused",
                    "adamw-forloop", "adafactor")
FSDP1_PREFETCH = {"none": "NO_PREFETCH", "pre": "BACKWARD_PRE", "post": "BACKWARD_POST"}


def library_of(knobs):
    """"ddp", "deepspeed", "fsdp" or None (no data-parallel knob)."""
    if knobs.get("ddp"):
        return "ddp"
    if knobs.get("zero"):
        return "deepspeed"
    if knobs.get("fsdp"):
        return "fsdp"
    return None


def add_dist(plan, knobs, model_config):
    """Adds plan["dist"] for a configuration with data-parallel knobs (changes `plan`)."""
    library = library_of(knobs)
    if library is None:
        return plan
    _refuse_unsupported(plan, knobs, library)
    plan["build"]["device"] = "cpu"
    plan["build"]["moved_to_gpu_by"] = {
        "ddp": "model.to('cuda') before DistributedDataParallel (HF Trainer _move_model_to_device)",
        "deepspeed": "deepspeed.initialize (or deepspeed.zero.Init while building)",
        "fsdp": "FSDP's wrapping (accelerator.prepare, or fully_shard / FSDP by hand)",
    }[library]
    dist = {"library": library, "world_size": 1, "rank": 0, "backend": BACKEND_GPU,
            "backend_cpu_test": "gloo"}
    if library == "ddp":
        dist["ddp"] = {"device_ids": [0], "bucket_cap_mb": 25,
                       "gradient_as_bucket_view": False}
    elif library == "deepspeed":
        dist["deepspeed"] = _deepspeed(plan, knobs, model_config)
        plan["requires"].append("deepspeed")
    else:
        dist["fsdp"] = _fsdp(plan, knobs)
        if knobs["fsdp_wrap"] == "trainer":
            plan["requires"].append("accelerate")
    plan["dist"] = dist
    return plan


def _refuse_unsupported(plan, knobs, library):
    if knobs["finetune"] == "qlora":
        raise PlanSkip(f"qlora under {library} is not driven by the harness yet")
    if knobs["grad_accum"] != 1:
        raise PlanSkip("grad_accum > 1 under a data-parallel library is not driven yet "
                       "(DeepSpeed steps the engine every micro-batch, DDP/accelerate need no_sync)")
    if plan["loss"]["kind"] != "hf":
        raise PlanSkip(f"loss {plan['loss']['kind']} needs the bare model; "
                       f"{library} wraps it (only loss hf is driven)")
    if plan["task"] != "causal-lm":
        raise PlanSkip(f"{plan['task']} under {library} is not driven yet")
    if knobs["precision"] in ("fp16", "fp16-mixed"):
        raise PlanSkip(f"fp16 under {library} needs its loss scaler; not driven yet "
                       "(fp32, bf16 and bf16-mixed are)")
    if library == "deepspeed" and knobs["optimizer"] not in DEEPSPEED_ADAMW:
        raise PlanSkip(f"optimizer {knobs['optimizer']} under DeepSpeed: the harness drives "
                       f"its config's AdamW only ({', '.join(DEEPSPEED_ADAMW)})")
    if library != "deepspeed" and knobs["optimizer"] not in TORCH_OPTIMIZERS:
        raise PlanSkip(f"optimizer {knobs['optimizer']} under {library} is not driven yet")
    if library == "fsdp" and knobs["optimizer"] == "none":
        raise PlanSkip("FSDP without an optimizer is not driven (accelerate prepares both)")


def _hidden_size(model_config):
    hidden = model_config.get("hidden_size") or model_config.get("n_embd") or 0
    if isinstance(model_config.get("hidden_sizes"), list):
        hidden = max(model_config["hidden_sizes"])
    return int(hidden)


def _deepspeed(plan, knobs, model_config):
    """The DeepSpeed config dict, and how the model is built and stepped."""
    stage = knobs["zero"]
    zero = {"stage": stage}
    hidden = _hidden_size(model_config)
    if knobs["zero_buckets"] == "hf-auto":
        # transformers integrations/deepspeed.py HfTrainerDeepSpeedConfig.trainer_config_finalize
        # (5.17 / 5.24): what the Trainer writes for "auto".
        zero["reduce_bucket_size"] = hidden * hidden
        if stage == 3:
            zero["stage3_prefetch_bucket_size"] = int(0.9 * hidden * hidden)
            zero["stage3_param_persistence_threshold"] = 10 * hidden
    if knobs["offload"] in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": "cpu"}
    if knobs["offload"] == "params":
        zero["offload_param"] = {"device": "cpu"}
    config = {
        "train_micro_batch_size_per_gpu": knobs["batch"],
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": LEARNING_RATE, "torch_adam": True,
                                                  **DEEPSPEED_ADAMW[knobs["optimizer"]]}},
        "steps_per_print": 1000000,
    }
    if knobs["offload"] != "none":
        # A torch optimizer with offload (engine.py _configure_optimizer, 0.19.8:
        # "ZeRO-Offload with a client provided optimizer" otherwise).
        config["zero_force_ds_cpu_optimizer"] = False
    half = knobs["precision"] in ("bf16", "bf16-mixed")
    if half:
        config["bf16"] = {"enabled": True}
    # The engine casts the module to bf16 itself (engine.py _configure_distributed_model):
    # no autocast, no separate optimizer object, no GradScaler.
    plan["precision"]["autocast_dtype"] = None
    plan["precision"]["grad_scaler"] = False
    plan["optimizer"] = None
    plan["zero_grad"] = "engine.step() (the engine zeroes the gradients)"
    zero_init = stage == 3 and not knobs["no_zero_init"]
    return {
        "config": config,
        "zero_init": zero_init,
        "build": ("transformers from_config under HfDeepSpeedConfig(config): deepspeed.zero.Init"
                  if zero_init else "transformers from_config on the CPU, before DeepSpeed"),
        "initialize": "deepspeed.initialize(model=model, model_parameters=trainable, config=config)",
        "loop": "loss = engine(input_ids, labels).loss; engine.backward(loss); engine.step()",
        "environment": {"DS_ACCELERATOR": "cuda (cpu in the CPU test)"},
    }


def _fsdp(plan, knobs):
    """accelerate's FSDP plugin as the HF Trainer builds it, or FSDP by hand per layer."""
    version = knobs["fsdp_version"]
    full = knobs["fsdp"] == "full"
    offload = knobs["offload"] != "none"
    mixed = "bf16" if knobs["precision"] == "bf16-mixed" else "no"
    if mixed == "bf16":
        # accelerate's prepared forward runs under autocast (accelerator.py prepare_model)
        # and the plugin gathers bf16 (set_mixed_precision): the harness adds none.
        plan["precision"]["autocast_dtype"] = None
    if knobs["fsdp_wrap"] == "layers":
        return _fsdp_by_hand(plan, knobs, version, full, offload, mixed)
    # transformers 5.17 / 5.24 TrainingArguments._process_fsdp_args with
    # fsdp="full_shard auto_wrap" (or "shard_grad_op auto_wrap"; "offload" adds cpu_offload).
    plugin = {"fsdp_version": version, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
              "cpu_ram_efficient_loading": False, "state_dict_type": "FULL_STATE_DICT"}
    if offload:
        plugin["cpu_offload"] = True
    if version == 2:
        plugin["reshard_after_forward"] = full
    else:
        plugin.update(reshard_after_forward="full_shard" if full else "shard_grad_op",
                      forward_prefetch=False,
                      backward_prefetch=FSDP1_PREFETCH[knobs["fsdp_backward_prefetch"]],
                      use_orig_params=True, sync_module_states=True)
    peft_policy = version == 1 and knobs["finetune"] != "full"
    return {
        "wrapper": "accelerate",
        "plugin": plugin,
        "mixed_precision": mixed,
        "update_fsdp_plugin_peft": peft_policy,
        "order": ("prepare(model), then the optimizer on the prepared model, prepare(optimizer)"
                  if version == 1 else "the optimizer, then prepare(model, optimizer)"),
        "loop": "loss = model(...).loss; accelerator.backward(loss); optimizer.step(); "
                "optimizer.zero_grad(set_to_none=True)",
    }


def _fsdp_by_hand(plan, knobs, version, full, offload, mixed):
    if offload:
        raise PlanSkip("fsdp_wrap layers with offload is not driven yet (the Trainer's is)")
    if mixed == "bf16":
        raise PlanSkip("fsdp_wrap layers with bf16-mixed is not driven yet: by hand it would "
                       "need a MixedPrecision policy the estimate does not name (fp32 / bf16 are)")
    if version == 1:
        prefetch = FSDP1_PREFETCH[knobs["fsdp_backward_prefetch"]]
        return {"wrapper": "FullyShardedDataParallel", "unit": "each decoder layer, then the root",
                "sharding_strategy": "FULL_SHARD" if full else "SHARD_GRAD_OP",
                "backward_prefetch": prefetch, "use_orig_params": True,
                "order": "wrap, then the optimizer on the wrapped model"}
    return {"wrapper": "fully_shard", "unit": "each decoder layer, then the root",
            "reshard_after_forward": full, "order": "wrap, then the optimizer"}
