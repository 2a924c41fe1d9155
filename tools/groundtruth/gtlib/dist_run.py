"""The worker's data-parallel path: one rank (world size 1) of DDP, DeepSpeed or FSDP.

Executes plan["dist"] (gtlib/dist_plan.py says what and why). torch and the
libraries are passed in or imported inside functions, so importing this module
needs none of them.

On the GPU the process group is NCCL's and everything runs as a user's rank 0
would. On the CPU (device="cpu": the harness's CPU test only) the group is
gloo's, DeepSpeed runs on its CPU accelerator (DS_ACCELERATOR=cpu, set before
deepspeed is imported), and three things differ, each only to make the CPU run
possible (shared/reference/multi_rank_cpu.md):
  * accelerate never promotes a CPU process state to FSDP
    (AcceleratorState.__init__, accelerate 1.15), so the state is set to FSDP by
    hand; FSDP1 also needs the device as torch.device("cpu");
  * FSDP1 refuses `sync_module_states=True` on the CPU
    (FullyShardedDataParallelPlugin.__post_init__): off there;
  * DeepSpeed's CPU backend JIT-builds its shared-memory op at
    init_distributed (deepspeed/comm/torch.py build_shm_op, ~24 s the first
    time): skipped, a world of one rank never uses it.
"""

from __future__ import annotations

import contextlib
import os
import socket

RANK_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1"}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_rank_environment(plan, device):
    """The variables torchrun sets for rank 0 of 1 (accelerate and DeepSpeed read them).

    DS_ACCELERATOR must be set before deepspeed is first imported: it picks its
    accelerator once (deepspeed/accelerator/real_accelerator.py get_accelerator).
    """
    os.environ.update(RANK_ENV, MASTER_PORT=str(_free_port()))
    # One rank on one host: loopback is all NCCL's bootstrap needs (it skips `lo` when
    # another interface exists, and the device machine may have none that works).
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    if plan["dist"]["library"] == "deepspeed":
        os.environ["DS_ACCELERATOR"] = "cuda" if device == "cuda" else "cpu"


def init_process_group(torch, plan, device):
    """torch.distributed of one rank; returns facts recorded under model.applied.dist."""
    set_rank_environment(plan, device)
    backend = plan["dist"]["backend"] if device == "cuda" else plan["dist"]["backend_cpu_test"]
    if plan["dist"]["library"] == "deepspeed":
        import sys
        import deepspeed
        import deepspeed.comm.torch  # noqa: F401  (the module; its name is also torch's)
        # torch._dynamo's first import fails inside zero.Init, which has replaced tensor
        # construction (multi_rank_cpu.md: "Signature mismatch ... tensor_pynew").
        import torch._dynamo  # noqa: F401
        if device == "cpu":
            sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
    else:
        torch.distributed.init_process_group(backend, rank=0, world_size=1)
    facts = {"backend": str(torch.distributed.get_backend()),
             "world_size": torch.distributed.get_world_size()}
    if device == "cuda":
        facts["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        facts["nccl_socket_ifname"] = os.environ.get("NCCL_SOCKET_IFNAME")
    return facts


def destroy_process_group(torch):
    with contextlib.suppress(Exception):
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def builds_on_cpu(plan):
    """True when the plan's model is built on the CPU and the library moves it (every
    data-parallel plan but ZeRO-3 with zero.Init, which builds straight into GPU shards)."""
    dist = plan.get("dist")
    if not dist:
        return False
    return not (dist["library"] == "deepspeed" and dist["deepspeed"]["zero_init"])


@contextlib.contextmanager
def build_context(plan):
    """ZeRO-3 with zero.Init: a live HfDeepSpeedConfig makes transformers' from_config
    build inside deepspeed.zero.Init (modeling_utils.py _from_config), as from_pretrained
    does for HF Trainer users. Kept alive until the engine exists."""
    ds = plan["dist"].get("deepspeed") if plan.get("dist") else None
    if not ds or not ds["zero_init"]:
        yield None
        return
    from transformers.integrations import HfDeepSpeedConfig
    keep = HfDeepSpeedConfig(ds["config"])
    try:
        yield keep
    finally:
        del keep


class Wrapped:
    """What the loop needs from a wrapped model: the module to call, the backward,
    the optimizer step (zero_grad included), and facts for the record."""

    def __init__(self, model, backward=None, step=None, optimizer=None, facts=None, keep=None):
        self.model, self.backward, self.step = model, backward, step
        self.optimizer, self.facts, self.keep = optimizer, facts or {}, keep


def wrap(torch, model, plan, device, build_optimizer):
    """Hands the built model to the library as its users do; returns a Wrapped.

    build_optimizer(module): the plan's torch optimizer over module's trainable
    parameters (worker.build_optimizer).
    """
    library = plan["dist"]["library"]
    if library == "ddp":
        return _ddp(torch, model, plan, device, build_optimizer)
    if library == "deepspeed":
        return _deepspeed(torch, model, plan)
    if plan["dist"]["fsdp"]["wrapper"] == "accelerate":
        return _accelerate_fsdp(torch, model, plan, device, build_optimizer)
    return _fsdp_by_hand(torch, model, plan, device, build_optimizer)


def _ddp(torch, model, plan, device, build_optimizer):
    from torch.nn.parallel import DistributedDataParallel
    spec = plan["dist"]["ddp"]
    model.to(device)
    ddp = DistributedDataParallel(
        model, device_ids=spec["device_ids"] if device == "cuda" else None,
        bucket_cap_mb=spec["bucket_cap_mb"],
        gradient_as_bucket_view=spec["gradient_as_bucket_view"])
    return Wrapped(ddp, optimizer=build_optimizer(model),
                   facts={"wrapper": type(ddp).__name__})


def _deepspeed(torch, model, plan):
    import deepspeed
    spec = plan["dist"]["deepspeed"]
    trainable = [p for p in model.parameters() if p.requires_grad]
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=trainable,
                                                   config=spec["config"])
    inner = getattr(optimizer, "optimizer", None)
    facts = {"wrapper": type(engine).__name__, "deepspeed": deepspeed.__version__,
             "zero_stage": engine.zero_optimization_stage(),
             "optimizer": type(optimizer).__name__,
             "inner_optimizer": type(inner).__name__ if inner is not None else None,
             "bf16": bool(engine.bfloat16_enabled()),
             "zero_init": spec["zero_init"]}
    return Wrapped(engine, backward=engine.backward, step=engine.step, facts=facts)


def _fsdp_plugin(plan, device):
    from accelerate.utils import FullyShardedDataParallelPlugin
    kwargs = dict(plan["dist"]["fsdp"]["plugin"])
    if device == "cpu" and kwargs.get("sync_module_states"):
        kwargs["sync_module_states"] = False  # refused on the CPU (module docstring)
    return FullyShardedDataParallelPlugin(**kwargs)


def _accelerator(torch, plan, device):
    """Accelerator(mixed_precision=, fsdp_plugin=) as the HF Trainer makes it; on the CPU
    the state is forced to FSDP (module docstring; tools/reference/vsref/ranks.py)."""
    from accelerate import Accelerator, PartialState
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType
    spec = plan["dist"]["fsdp"]
    plugin = _fsdp_plugin(plan, device)
    if device == "cuda":
        return Accelerator(mixed_precision=spec["mixed_precision"], fsdp_plugin=plugin)
    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState(cpu=True, backend="gloo")
    if plugin.fsdp_version == 1:
        PartialState._shared_state["device"] = torch.device("cpu")
    accelerator = Accelerator(mixed_precision=spec["mixed_precision"])
    state = AcceleratorState()
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    if spec["mixed_precision"] != "no":
        plugin.set_mixed_precision(spec["mixed_precision"])
    state.fsdp_plugin = plugin
    return accelerator


def _accelerate_fsdp(torch, model, plan, device, build_optimizer):
    """Trainer._prepare_for_training's order (transformers 5.17 / 5.24)."""
    spec = plan["dist"]["fsdp"]
    accelerator = _accelerator(torch, plan, device)
    if spec["plugin"]["fsdp_version"] == 1:
        if spec["update_fsdp_plugin_peft"]:
            update_fsdp_plugin_peft(model, accelerator)
        prepared = accelerator.prepare(model)
        optimizer = accelerator.prepare(build_optimizer(prepared))
    else:
        prepared, optimizer = accelerator.prepare(model, build_optimizer(model))

    def step():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return Wrapped(prepared, backward=accelerator.backward, step=step, optimizer=optimizer,
                   facts={"wrapper": "accelerate", **fsdp_units(torch, prepared)},
                   keep=accelerator)


def update_fsdp_plugin_peft(model, accelerator):
    """transformers' own call (distributed/fsdp.py in 5.x, re-exported by integrations.fsdp)."""
    try:
        from transformers.integrations.fsdp import update_fsdp_plugin_peft as update
    except ImportError:
        from transformers.distributed.fsdp import update_fsdp_plugin_peft as update
    update(model, accelerator)


def decoder_layer_class(torch, model):
    """The class of the model's decoder layers (tools/reference/vsref/ranks.py's rule:
    the items of the ModuleList named layers, h or layer)."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) and name.endswith(
                ("layers", "h", "layer")):
            return type(module[0])
    raise RuntimeError("no decoder layer list found")


def _fsdp_by_hand(torch, model, plan, device, build_optimizer):
    spec = plan["dist"]["fsdp"]
    layer = decoder_layer_class(torch, model)
    if spec["wrapper"] == "fully_shard":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(device, (1,))
        for module in list(model.modules()):
            if isinstance(module, layer):
                fully_shard(module, mesh=mesh, reshard_after_forward=spec["reshard_after_forward"])
        fully_shard(model, mesh=mesh, reshard_after_forward=spec["reshard_after_forward"])
        wrapped = model
    else:
        import functools
        from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        prefetch = spec["backward_prefetch"]
        wrapped = FullyShardedDataParallel(
            model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                      transformer_layer_cls={layer}),
            sharding_strategy=getattr(ShardingStrategy, spec["sharding_strategy"]),
            backward_prefetch=None if prefetch == "NO_PREFETCH" else getattr(BackwardPrefetch,
                                                                              prefetch),
            device_id=torch.cuda.current_device() if device == "cuda" else torch.device("cpu"),
            use_orig_params=spec["use_orig_params"])
    optimizer = build_optimizer(wrapped)

    def step():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return Wrapped(wrapped, step=step, optimizer=optimizer,
                   facts={"wrapper": spec["wrapper"], **fsdp_units(torch, wrapped)})


def fsdp_units(torch, model):
    """How many FSDP units the wrapping made, and the first few by name."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    names = [name or "<root>" for name, m in model.named_modules()
             if isinstance(m, (FullyShardedDataParallel, FSDPModule))]
    return {"fsdp_units": len(names), "fsdp_unit_names": names[:8]}


def parameter_numel(p):
    """A parameter's logical element count: ZeRO-3 keeps 0 elements in `p` between uses
    and the full count in `ds_numel` (deepspeed partition_parameters.py)."""
    numel = getattr(p, "ds_numel", None)
    return int(numel) if numel is not None else p.numel()
