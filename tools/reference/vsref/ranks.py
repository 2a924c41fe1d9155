"""Multi-rank reference points: N real ranks over gloo, each recorded tensor by tensor.

    point.dist = "ddp" | "fsdp1" | "fsdp2" | "zero1" | "zero2" | "zero3", point.gpus = N

One process per rank (torch.multiprocessing.spawn), torch.distributed over gloo, the
real library wrapping the real transformers model the way its users do, two training
steps; every rank writes its own trace (`OUT.rankR`). The recording starts before the
library wraps the model, so what the wrapper allocates at construction (DDP's buckets,
DeepSpeed's flat buffers and partitions, FSDP's shards) is part of the setup; the
fidelity check compares every rank's phases with `estimate --gpus N ...`'s stream for
that rank (docs/fidelity.md, "Multi-rank points").

Versions: torch 2.13.0 (DDP, FSDP1 FullyShardedDataParallel, FSDP2 fully_shard),
DeepSpeed 0.19.8 on its CPU accelerator (DS_ACCELERATOR=cpu: gloo, since oneCCL is not
installed), transformers 5.24.0 / 4.57.6, PEFT 0.21.2. DeepSpeed's optimizer is its
config's "AdamW" with "torch_adam": true, a torch.optim.AdamW with the point's
implementation (foreach / for-loop / fused): DeepSpeed's own FusedAdam is a CUDA kernel
(its CPU build is a JIT-compiled op that takes 40 s to build and allocates nothing the
recorder sees) and DeepSpeedCPUAdam likewise.
"""

import functools
import gc
import os
import socket

import torch

from . import gloo_order
from .runner import apply_knobs, build_model, make_batch, make_optimizer, step_loss

DIST_MODES = ("ddp", "fsdp1", "fsdp2", "zero1", "zero2", "zero3")
# ZeRO bucket sizes, in elements, of the "small" setting (what a config that names them
# gets; DeepSpeed's own defaults, 5e8 elements, would make a 2 GB buffer per backward on
# a model of 0.3 M parameters) and of transformers' "auto" (hidden 128:
# integrations/deepspeed.py trainer_config_finalize).
SMALL_BUCKET = 50_000
DDP_SMALL_BUCKET_MB = 1  # the tiny model's gradients (1.3 MiB) in two buckets


def run_many(jobs):
    """Runs multi-rank jobs ({"point", "config", "out"}), grouped by their rank count and
    library: one spawn of N processes serves every job of a group in turn (torch and
    transformers are imported once per rank). DeepSpeed's points get processes of their
    own: zero.Init replaces torch functions process-wide (partition_parameters.py), which
    would change the other libraries' points after it. A job that fails writes
    `out + ".error"`; its group's ranks are then restarted for the jobs after it."""
    by_world = {}
    for job in jobs:
        key = (job["point"].gpus, job["point"].dist.startswith("zero"))
        by_world.setdefault(key, []).append(job)
    for (world, _), group in sorted(by_world.items()):
        while group:
            done = _spawn(world, group)
            group = group[done + 1:]


def _spawn(world, jobs):
    """Returns the index of the job that failed (len(jobs) when none did)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(_rank, args=(world, jobs, port), nprocs=world)
    except Exception as e:  # noqa: BLE001 - the failing job is marked, the rest go on
        for i, job in enumerate(jobs):
            if os.path.exists(job["out"] + ".error") or not all(
                    os.path.exists(f"{job['out']}.rank{r}") for r in range(world)):
                if not os.path.exists(job["out"] + ".error"):
                    with open(job["out"] + ".error", "w", encoding="utf-8") as f:
                        f.write(f"{type(e).__name__}: {str(e).strip()[-2000:]}\n")
                return i
    return len(jobs)


def _rank(rank, world, jobs, port):
    import datetime

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      DS_ACCELERATOR="cpu")
    torch.set_num_threads(1)
    gloo_order.install()
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        for job in jobs:
            point = job["point"]
            runner = _run_accelerate_fsdp if point.launcher == "accelerate" else (
                _RUNNERS[point.dist])
            try:
                runner(point, job["config"], f"{job['out']}.rank{rank}")
            except Exception as e:
                with open(job["out"] + ".error", "w", encoding="utf-8") as f:
                    f.write(f"rank {rank}: {type(e).__name__}: {e}\n")
                raise
            gc.collect()
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _meta(point):
    import transformers

    return [("reference", point.name()), ("transformers", transformers.__version__),
            ("torch", torch.__version__), ("rank", os.environ["RANK"])]


def _record(point, out, model, optimizer=None, inputs=None):
    import vramscope_trace

    return vramscope_trace.record(out, model=model, optimizer=optimizer, inputs=inputs,
                                  meta=_meta(point))


def _loop(point, model, optimizer, batch):
    """The usual loop (runner._train's): zero_grad, the loss under autocast for *-mixed,
    backward, step. Collective hooks hold state in reference cycles (FSDP2's), collected
    at one fixed point of the step."""
    autocast = point.precision == "bf16-mixed"
    for _ in range(point.steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = step_loss(point, model, batch)
        loss.backward()
        del loss
        gc.collect()
        optimizer.step()


def _run_ddp(point, config_dict, out):
    from torch.nn.parallel import DistributedDataParallel

    model = apply_knobs(point, build_model(point, config_dict))
    optimizer = make_optimizer(point, model)
    batch = make_batch(point, model.config)
    cap_mb = DDP_SMALL_BUCKET_MB if point.dist_buckets == "small" else 25
    with _record(point, out, model, optimizer, {"batch": batch}):
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap_mb,
                                      gradient_as_bucket_view=point.bucket_view)
        _loop(point, ddp, optimizer, batch)


def decoder_layer_class(model):
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.endswith(("layers", "h", "layer")):
            return type(module[0])
    raise RuntimeError("no decoder layer list found")


def _run_fsdp2(point, config_dict, out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = apply_knobs(point, build_model(point, config_dict))
    batch = make_batch(point, model.config)
    layer_class = decoder_layer_class(model)
    # FULL_SHARD: fully_shard's default (reshard_after_forward=None: True for every unit
    # but the root, which stays unsharded until backward); SHARD_GRAD_OP: False for all.
    reshard = {} if point.fsdp == "full" else {"reshard_after_forward": False}
    with _record(point, out, model, None, {"batch": batch}) as rec:
        mesh = init_device_mesh("cpu", (point.gpus,))
        for module in model.modules():
            if isinstance(module, layer_class):
                fully_shard(module, mesh=mesh, **reshard)
        fully_shard(model, mesh=mesh, **reshard)
        optimizer = make_optimizer(point, model)
        rec.add_optimizer(optimizer)
        _loop(point, model, optimizer, batch)


def _fsdp1_policy(point, model):
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if point.finetune != "full":
        # What the HF Trainer sets for a PEFT model (transformers update_fsdp_plugin_peft):
        # every trainable leaf (each LoRA A / B) its own unit, or'ed with the decoder
        # layers (peft 0.21.2 utils/other.py fsdp_auto_wrap_policy).
        from peft.utils.other import fsdp_auto_wrap_policy

        return fsdp_auto_wrap_policy(model)
    return functools.partial(transformer_auto_wrap_policy,
                             transformer_layer_cls={decoder_layer_class(model)})


def _run_fsdp1(point, config_dict, out):
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    model = apply_knobs(point, build_model(point, config_dict))
    batch = make_batch(point, model.config)
    strategy = ShardingStrategy.SHARD_GRAD_OP if point.fsdp == "grad-op" else (
        ShardingStrategy.FULL_SHARD)
    with _record(point, out, model, None, {"batch": batch}) as rec:
        # device_id=cpu: FSDP1 refuses to start without an accelerator otherwise
        # (_init_utils.py _init_device_handle, torch 2.13).
        wrapped = FullyShardedDataParallel(
            model, auto_wrap_policy=_fsdp1_policy(point, model), sharding_strategy=strategy,
            device_id=torch.device("cpu"), use_orig_params=True)
        optimizer = make_optimizer(point, wrapped)
        rec.add_optimizer(optimizer)
        _loop(point, wrapped, optimizer, batch)


def _accelerator_for_fsdp(point):
    """An Accelerator whose FSDP plugin is what TrainingArguments(fsdp="full_shard
    auto_wrap", fsdp_config={"version": V, ...}) hands accelerate (transformers 5.24
    TrainingArguments._process_fsdp_args: TRANSFORMER_BASED_WRAP over the model's
    _no_split_modules, use_orig_params, backward_prefetch NO_PREFETCH, no CPU-RAM-efficient
    loading here).

    accelerate never turns MULTI_CPU into FSDP (AcceleratorState.__init__, 1.15: only
    accelerator device kinds are promoted), so the state is set to FSDP by hand after the
    CPU process state exists; FSDP1 also needs the device as torch.device("cpu") (it
    refuses "cpu:0"). Everything after that (the plugin's policy, mixed precision,
    prepare's wrapping) is accelerate's own code."""
    from accelerate import Accelerator, PartialState
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    # One Accelerator per point: the singleton states of the previous point go first
    # (the process group stays).
    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState(cpu=True, backend="gloo")
    version = int(point.dist[-1])
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=version, auto_wrap_policy="transformer_based_wrap",
        sharding_strategy="FULL_SHARD" if point.fsdp == "full" else "SHARD_GRAD_OP",
        reshard_after_forward=point.fsdp == "full" if version == 2 else None,
        use_orig_params=True, sync_module_states=False, cpu_ram_efficient_loading=False,
        backward_prefetch="NO_PREFETCH" if version == 1 else None,
        state_dict_type="SHARDED_STATE_DICT" if version == 2 else "FULL_STATE_DICT")
    mixed = "bf16" if point.precision == "bf16-mixed" else "no"
    if version == 1:
        PartialState._shared_state["device"] = torch.device("cpu")
    accelerator = Accelerator(mixed_precision=mixed)
    state = AcceleratorState()
    # Both singletons: the process state is consulted again while preparing.
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    if mixed != "no":
        plugin.set_mixed_precision(mixed)
    state.fsdp_plugin = plugin
    return accelerator


def _run_accelerate_fsdp(point, config_dict, out):
    # *-mixed: the model in fp32, the forward under accelerate's autocast (prepare_model).
    # Built first, as the Trainer's model exists before its Accelerator.
    model = apply_knobs(point, build_model(point, config_dict))
    accelerator = _accelerator_for_fsdp(point)
    if point.finetune != "full":
        # The Trainer's own step for a PEFT model (trainer.py _prepare_for_training).
        from transformers.distributed.fsdp import update_fsdp_plugin_peft

        update_fsdp_plugin_peft(model, accelerator)
    batch = make_batch(point, model.config)
    with _record(point, out, model, None, {"batch": batch}) as rec:
        # Together, as the Trainer does for FSDP2 (the optimizer's parameters are swapped
        # for the sharded ones); FSDP1 with use_orig_params keeps the same parameters.
        model, optimizer = accelerator.prepare(model, make_optimizer(point, model))
        rec.add_optimizer(optimizer.optimizer)
        for _ in range(point.steps):
            optimizer.zero_grad(set_to_none=True)
            loss = step_loss(point, model, batch)
            accelerator.backward(loss)
            del loss
            gc.collect()
            optimizer.step()


def deepspeed_config(point, hidden):
    stage = int(point.dist[-1])
    zero = {"stage": stage}
    if point.dist_buckets == "small":
        zero.update(reduce_bucket_size=SMALL_BUCKET, allgather_bucket_size=SMALL_BUCKET)
        if stage == 3:
            zero.update(stage3_prefetch_bucket_size=SMALL_BUCKET,
                        stage3_param_persistence_threshold=0)
    elif not point.dist_buckets:
        # transformers integrations/deepspeed.py HfTrainerDeepSpeedConfig.trainer_config_finalize
        zero.update(reduce_bucket_size=hidden * hidden)
        if stage == 3:
            zero.update(stage3_prefetch_bucket_size=int(0.9 * hidden * hidden),
                        stage3_param_persistence_threshold=10 * hidden)
    if point.overlap_comm:
        zero["overlap_comm"] = point.overlap_comm == "on"
    if point.dist_offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    if point.dist_offload == "params":
        zero["offload_param"] = {"device": "cpu"}
    kind = {"adamw-foreach": {"foreach": True}, "adamw-fused": {"fused": True},
            "adamw-forloop": {"foreach": False}}[point.optimizer]
    config = {"train_micro_batch_size_per_gpu": point.batch, "gradient_accumulation_steps": 1,
              "zero_optimization": zero,
              "optimizer": {"type": "AdamW",
                            "params": {"lr": 1e-4, "torch_adam": True, **kind}}}
    if point.dist_offload:
        # A torch optimizer with offload needs this (deepspeed/runtime/engine.py
        # _configure_optimizer: "ZeRO-Offload with a client provided optimizer").
        config["zero_force_ds_cpu_optimizer"] = False
    if point.precision in ("bf16", "bf16-mixed"):
        config["bf16"] = {"enabled": True}
    return config


def _run_zero(point, config_dict, out):
    import deepspeed

    # Over the process group already made (deepspeed/comm/comm.py init_distributed keeps
    # an initialised torch.distributed).
    deepspeed.init_distributed(dist_backend="gloo")
    # torch._dynamo's first import fails inside zero.Init, which has replaced tensor
    # construction (TypeError: Signature mismatch ... tensor_pynew): imported before.
    import torch._dynamo  # noqa: F401

    config = deepspeed_config(point, config_dict.get("hidden_size", 0))
    existing = []
    if point.dist == "zero3" and point.zero_init:
        # transformers' from_pretrained under HfDeepSpeedConfig: the model is built
        # inside deepspeed.zero.Init, each parameter partitioned as it is made.
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = build_model(point, config_dict)
        existing = [p.ds_tensor for p in model.parameters() if hasattr(p, "ds_tensor")]
    else:
        model = build_model(point, config_dict)
    model = apply_knobs(point, model)
    batch = make_batch(point, model.config)
    trainable = [p for p in model.parameters() if p.requires_grad]
    with _record(point, out, model, None, {"batch": batch, "partitions": existing}) as rec:
        engine, _, _, _ = deepspeed.initialize(model=model, config=config,
                                               model_parameters=trainable)
        rec.add_optimizer(engine.optimizer)
        inner = getattr(engine.optimizer, "optimizer", None)
        if inner is not None and inner is not engine.optimizer:
            rec.add_optimizer(inner)
        for _ in range(point.steps):
            loss = engine(**batch).loss
            engine.backward(loss)
            del loss
            gc.collect()
            engine.step()


_RUNNERS = {"ddp": _run_ddp, "fsdp1": _run_fsdp1, "fsdp2": _run_fsdp2, "zero1": _run_zero,
            "zero2": _run_zero, "zero3": _run_zero}
