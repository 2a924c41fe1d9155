"""Measures ONE configuration in a fresh process (started by driver.py).

    python3 -m gtlib.worker --job JOB.json --result RESULT.json
    python3 -m gtlib.worker --probe RESULT.json          # environment only
    python3 -m gtlib.worker --prepare-4bit-source JOB.json DIR   # QLoRA helper

The driver sets PYTORCH_CUDA_ALLOC_CONF in this process's environment before
it starts, so the allocator reads it when CUDA initialises here. torch,
transformers, peft and bitsandbytes are imported inside functions only, so
`import gtlib.worker` works on a machine without them.

Order of events (docs/groundtruth.md, "What is measured"):
  1. import torch and the libraries the plan needs;
  2. (QLoRA) a helper process saves random weights to a temporary directory;
  3. CUDA init + one tiny tensor: CUDA context = device used - reserved;
     then the tiny tensor is freed and the cache emptied;
  4. "before_model" readings; peak counters reset;
  5. setup: model built on the GPU, checkpointing, LoRA, optimizer (no state
     yet: PyTorch creates it lazily in the first step), scaler, batch;
     "setup" readings (peaks cover the whole setup);
  6. the steps (loop.train), phase by phase;
  7. nvidia-smi's figure for this process, allocator statistics.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import dist_run
from . import env as envmod
from . import loop
from . import schema

MAX_MESSAGE_CHARS = 4000


def dtype_kwarg(transformers_version):
    """transformers >= 4.56 calls it `dtype`; older releases only know `torch_dtype`."""
    m = re.match(r"(\d+)\.(\d+)", transformers_version or "")
    if m and (int(m.group(1)), int(m.group(2))) >= (4, 56):
        return "dtype"
    return "torch_dtype"


def _load_hf_config(transformers, config_dict):
    """AutoConfig from a dict through a local config.json (no network: a directory path).

    `auto_map` is dropped: the harness only runs transformers' own model code,
    never code a config.json points to.
    """
    config_dict = {k: v for k, v in config_dict.items() if k != "auto_map"}
    with tempfile.TemporaryDirectory(prefix="vramscope-gt-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config_dict), encoding="utf-8")
        return transformers.AutoConfig.from_pretrained(tmp, local_files_only=True)


def device_context(torch, device):
    """`with torch.device(...)`: new tensors are created there (torch >= 2.0).

    Older torch has no such context manager; then tensors start on the CPU and
    build_model moves the model (tests on a CPU-only torch 1.13 rely on this).
    """
    if device == "cpu":  # the default device: no mode (zero.Init replaces the factories)
        return contextlib.nullcontext()
    ctx = torch.device(device)
    return ctx if hasattr(ctx, "__enter__") else contextlib.nullcontext()


def _from_config(torch, transformers, config, build, device="cuda"):
    cls = getattr(transformers, build["model_class"])
    kwargs = {dtype_kwarg(transformers.__version__): getattr(torch, build["dtype"]),
              "attn_implementation": build["attn_implementation"]}
    with device_context(torch, device):
        return cls.from_config(config, **kwargs)


def prepare_4bit_source(job_path, out_dir, device="cuda"):
    """QLoRA helper: random weights in the compute dtype, saved for from_pretrained.

    Built on the GPU by default (random initialisation of billions of weights is
    minutes on a CPU); this process exits before the measuring one touches CUDA.
    """
    import torch
    import transformers
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    torch.manual_seed(0)
    config = _load_hf_config(transformers, job["model"]["config"])
    model = _from_config(torch, transformers, config, job["plan"]["build"], device)
    model.save_pretrained(out_dir, safe_serialization=True)


def build_model(torch, job, plan, scratch_dir, device="cuda"):
    """Builds the model as the plan says; returns (model, HF model, applied facts).

    The HF model is the transformers PreTrainedModel (under PEFT's wrapper
    when there is one); applied facts record what the libraries report back.
    """
    import transformers
    build = plan["build"]
    applied = {"dtype_kwarg": dtype_kwarg(transformers.__version__)}
    config = _load_hf_config(transformers, job["model"]["config"])
    config.use_cache = False
    dist = plan.get("dist") is not None
    if dist:  # built on the CPU (or by zero.Init); the library moves it (dist_plan.py)
        device = "cpu"
    if build["method"] == "from_config":
        with dist_run.build_context(plan) if dist else contextlib.nullcontext():
            model = _from_config(torch, transformers, config, build, device)
    else:
        q = build["quantization"]
        bnb_config = transformers.BitsAndBytesConfig(
            load_in_4bit=q["load_in_4bit"], bnb_4bit_quant_type=q["bnb_4bit_quant_type"],
            bnb_4bit_use_double_quant=q["bnb_4bit_use_double_quant"],
            bnb_4bit_compute_dtype=getattr(torch, q["bnb_4bit_compute_dtype"]))
        cls = getattr(transformers, build["model_class"])
        model = cls.from_pretrained(
            scratch_dir, quantization_config=bnb_config, local_files_only=True,
            device_map={"": torch.cuda.current_device() if device == "cuda" else device},
            attn_implementation=build["attn_implementation"],
            **{applied["dtype_kwarg"]: getattr(torch, build["dtype"])})
    applied["moved_to_cuda_after_build"] = False
    if not dist and any(p.device.type != device for p in model.parameters()):
        model.to(device)  # a transformers release (or torch) that ignored the device context
        applied["moved_to_cuda_after_build"] = True
    model.config.use_cache = False

    ckpt = plan["gradient_checkpointing"]
    if build.get("prepare_model_for_kbit_training"):
        from peft import prepare_model_for_kbit_training
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=ckpt is not None,
            gradient_checkpointing_kwargs=dict(ckpt) if ckpt else None)
    elif ckpt is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(ckpt))

    lora = plan["lora"]
    if lora is not None:
        from peft import LoraConfig, get_peft_model
        lora_config = LoraConfig(
            r=lora["r"], lora_alpha=lora["lora_alpha"], lora_dropout=lora["lora_dropout"],
            target_modules=lora["target_modules"], bias=lora["bias"],
            task_type=lora["task_type"], fan_in_fan_out=lora["fan_in_fan_out"])
        with device_context(torch, device):
            model = get_peft_model(model, lora_config)
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    if plan["enable_input_require_grads"] and not hasattr(hf, "_require_grads_hook"):
        hf.enable_input_require_grads()
    model.train()

    applied.update({
        "architecture": type(hf).__name__,
        "attn_implementation": getattr(hf.config, "_attn_implementation", None),
        "gradient_checkpointing": getattr(hf, "is_gradient_checkpointing", None),
        "training_mode": model.training,
        "param_devices": sorted({str(p.device) for p in model.parameters()}),
    })
    return model, hf, applied


def model_facts(torch, model, hf, resolved, applied):
    """Parameter counts and bytes, as recorded under the result's "model" key."""
    parameters = trainable = 0
    by_dtype = {}
    for p in model.parameters():
        numel = dist_run.parameter_numel(p)
        quant_state = getattr(p, "quant_state", None)
        if type(p).__name__ == "Params4bit" and quant_state is not None:
            shape = getattr(quant_state, "shape", None)
            if shape is not None:
                numel = 1
                for d in shape:
                    numel *= int(d)
        parameters += numel
        stored = dist_run.parameter_numel(p)
        if p.requires_grad:
            trainable += stored
        key = str(p.dtype).replace("torch.", "")
        by_dtype[key] = by_dtype.get(key, 0) + stored * p.element_size()
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    lora_modules = None
    if hasattr(model, "peft_config"):
        lora_modules = sum(1 for m in model.modules()
                           if isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict)
                           and len(m.lora_A) > 0)
    return {
        "alias": resolved.get("alias"),
        "hub_id": resolved.get("hub_id"),
        "source": resolved.get("source"),
        "model_type": hf.config.model_type,
        "architecture": type(hf).__name__,
        "parameters": int(parameters),
        "trainable_parameters": int(trainable),
        "parameter_bytes_by_dtype": by_dtype,
        "buffer_bytes": int(buffer_bytes),
        "lora_modules": lora_modules,
        "applied": applied,
    }


def build_optimizer(torch, model, spec):
    if spec is None:
        return None
    module = importlib.import_module(spec["module"])
    cls = getattr(module, spec["class"])
    params = [p for p in model.parameters() if p.requires_grad]
    return cls(params, **spec["kwargs"])


def make_scaler(torch, device="cuda"):
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        return amp.GradScaler(device)
    return torch.cuda.amp.GradScaler()


def make_loss_fn(torch, model, hf, plan, input_ids, labels):
    loss = plan["loss"]
    if loss["kind"] == "hf":
        return loop.hf_loss_fn(model, input_ids, labels)
    backbone = getattr(hf, hf.base_model_prefix)
    return loop.chunked_causal_loss_fn(
        torch, backbone, hf.get_output_embeddings(), input_ids, labels,
        loss["chunks"], loss.get("final_logit_softcapping"))


class SnapshotHooks(loop.Hooks):
    """Records allocator history from step `first` through step `last` and dumps it as a
    snapshot pickle. By default one step (the second: the steady state); from step 1 it also
    shows how the first step laid out the cache the second one reuses; from step 0 the setup
    too (model loading: measure_with starts it before setup)."""

    def __init__(self, torch, path, last, max_entries, first=None):
        self.torch, self.path, self.max_entries = torch, path, max_entries
        self.last = last
        self.first = last if first is None else min(first, last)
        self.active = False
        self.error = None

    def before_step(self, step):
        if step != self.first:
            return
        memory = self.torch.cuda.memory
        try:
            memory._record_memory_history(enabled="all", context="all", stacks="python",
                                          max_entries=self.max_entries)
        except TypeError:  # torch 2.0 signature
            memory._record_memory_history(True, trace_alloc_max_entries=self.max_entries,
                                          trace_alloc_record_context=True)
        self.active = True

    def after_step(self, step):
        if step == self.last:
            self.close()

    def close(self):
        if not self.active:
            return
        self.active = False
        try:
            self.torch.cuda.memory._dump_snapshot(self.path)
        except Exception as e:  # a failed dump must not lose the measurement
            self.error = f"snapshot dump failed: {e}"
        finally:
            with contextlib.suppress(Exception):
                self.torch.cuda.memory._record_memory_history(enabled=None)


def _point(probe):
    return {"allocated_bytes": probe.allocated(), "reserved_bytes": probe.reserved(),
            "device_used_bytes": probe.device_used()}


def _prepare_4bit(job_path, scratch_dir, timeout_s):
    """Runs the QLoRA helper in its own process, so this one starts CUDA clean."""
    argv = [sys.executable, "-m", "gtlib.worker", "--prepare-4bit-source", str(job_path),
            str(scratch_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                          cwd=str(Path(__file__).resolve().parents[1]), check=False)
    if done.returncode != 0:
        raise RuntimeError("QLoRA weight preparation failed:\n" + done.stderr[-MAX_MESSAGE_CHARS:])


def measure(job, job_path, record, clock=time.perf_counter):
    """Fills `record` with the measurement of job's configuration."""
    plan = job["plan"]
    import torch
    if not torch.cuda.is_available():
        schema.mark_skipped(record, "no CUDA GPU visible to PyTorch")
        record["env"] = envmod.capture_environment(torch, probe_gpu=True)
        return
    import transformers  # noqa: F401  (imported before CUDA init: import time is not setup time)
    if plan["lora"] is not None:
        import peft  # noqa: F401
    if "bitsandbytes" in plan["requires"]:
        import bitsandbytes  # noqa: F401
    if "accelerate" in plan["requires"]:
        import accelerate  # noqa: F401  (deepspeed: after "go", dist_run.init_process_group)
    prebuilt = None
    if dist_run.builds_on_cpu(plan):
        # The model a data-parallel library moves to the GPU is built on the CPU: before
        # "go", it overlaps the previous configuration's measurement (no CUDA is touched).
        t_build = clock()
        torch.manual_seed(0)
        prebuilt = build_model(torch, job, plan, None, "cpu")
        prebuilt[2]["cpu_build_before_go_s"] = round(clock() - t_build, 3)
    if job.get("wait_for_go") and not wait_for_go(sys.stdin):
        raise SystemExit(0)  # the driver withdrew this job (time budget spent): no result

    # The driver's job directory (removed by the driver even if this process is killed)
    # holds QLoRA's saved weights; a standalone run uses a temporary directory.
    with contextlib.ExitStack() as stack:
        scratch = job.get("scratch_dir") or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="vramscope-gt-4bit-"))
        if plan["build"]["method"] == "from_pretrained_4bit":
            _prepare_4bit(job_path, scratch, job.get("prepare_timeout_s", 600))
        _measure_on_gpu(torch, job, plan, record, scratch, clock, prebuilt=prebuilt)


def wait_for_go(stream):
    """Blocks until the driver writes "go" (it does once the GPU is free); False on EOF.

    The driver starts the next configuration's worker while the current one
    runs, so its imports (seconds of CPU time) overlap the GPU work; the GPU
    itself is touched only after "go", when the previous worker has exited.
    """
    return stream.readline().strip() == "go"


def _measure_on_gpu(torch, job, plan, record, scratch, clock, device="cuda", probe=None,
                    prebuilt=None):
    """Measures on the GPU; device="cpu" with a probe is the CPU test seam (real libraries).

    prebuilt: build_model's result made before "go" (a model on the CPU), or None.
    """
    context_bytes = None
    if device == "cuda":
        probe = loop.CudaProbe(torch)
        torch.cuda.init()
        tiny = torch.zeros(1, device="cuda")
        probe.sync()
        context_bytes = probe.device_used() - probe.reserved()
        del tiny
        torch.cuda.empty_cache()
        record["env"] = envmod.capture_environment(torch, probe_gpu=True)
    state = {}
    dist_facts = None
    if plan.get("dist"):
        dist_facts = dist_run.init_process_group(torch, plan, device)

    def setup():
        torch.manual_seed(0)
        model, hf, applied = prebuilt or build_model(torch, job, plan, scratch, device)
        record["model"] = model_facts(torch, model, hf, job["model"], applied)
        step = backward = None
        if dist_facts is None:
            optimizer = build_optimizer(torch, model, plan["optimizer"])
        else:
            wrapped = dist_run.wrap(torch, model, plan, device,
                                    lambda module: build_optimizer(torch, module, plan["optimizer"]))
            applied["dist"] = {**dist_facts, **wrapped.facts}
            model, optimizer, step, backward = (wrapped.model, wrapped.optimizer, wrapped.step,
                                                wrapped.backward)
            state["keep"] = wrapped.keep
        scaler = make_scaler(torch, device) if plan["precision"]["grad_scaler"] else None
        autocast = None
        if plan["precision"]["autocast_dtype"]:
            dtype = getattr(torch, plan["precision"]["autocast_dtype"])
            autocast = lambda: torch.autocast(device, dtype=dtype)  # noqa: E731
        batch, seq = plan["batch"]["shape"]
        generator = torch.Generator(device=device)
        generator.manual_seed(0)
        input_ids = torch.randint(0, plan["batch"]["vocab_size"], (batch, seq), device=device,
                                  generator=generator)
        labels = input_ids  # the same tensor: labels = input_ids, no copy
        state.update(model=model, optimizer=optimizer, scaler=scaler, autocast=autocast,
                     step=step, backward=backward,
                     compute_loss=make_loss_fn(torch, model, hf, plan, input_ids, labels))

    def steps(recorder, hooks):
        loop.train(state["model"], state["optimizer"], state["compute_loss"], recorder,
                   plan["steps"], plan["batch"]["micro_batches_per_step"],
                   autocast=state["autocast"], scaler=state["scaler"], hooks=hooks,
                   backward=state["backward"], step=state["step"])

    snapshot = None
    if job.get("snapshot"):
        snapshot = SnapshotHooks(torch, job["snapshot"]["path"], min(2, plan["steps"]),
                                 job["snapshot"]["max_entries"],
                                 first=job["snapshot"].get("from_step"))
    try:
        measure_with(probe, record, setup, steps, snapshot, clock, context_bytes=context_bytes,
                     smi=envmod.nvidia_smi_process_used_bytes if device == "cuda" else None)
    finally:
        if dist_facts is not None:
            state.clear()
            dist_run.destroy_process_group(torch)


def measure_with(probe, record, setup, steps, snapshot=None, clock=time.perf_counter,
                 context_bytes=None, smi=None):
    """The device-independent core of a measurement (tests drive it on CPU).

    setup(): builds everything before the first step. steps(recorder, hooks):
    runs the training loop. Fills record["memory"], ["phases"], ["timing"],
    status ok or oom (with oom_at = the phase that was open); any other
    exception propagates after the partial readings are stored.
    """
    memory = {
        "device_total_bytes": probe.device_total(),
        "cuda_context_bytes": context_bytes if context_bytes is None or context_bytes >= 0 else None,
        "before_model": _point(probe),
        "setup": None,
        "peak_allocated_bytes": None,
        "peak_reserved_bytes": None,
        "peak_device_used_bytes": None,
        "num_alloc_retries": 0,
        "num_ooms": 0,
        "allocator_stats": {},
        "nvidia_smi_process_bytes": None,
    }
    record["memory"] = memory
    recorder = loop.PhaseRecorder(probe, clock)
    oom_where = {"step": 0, "micro_batch": None, "phase": "setup"}
    try:
        if snapshot is not None and snapshot.first == 0:
            snapshot.before_step(0)  # from the setup on: a load-time peak (QLoRA's)
        probe.reset_peak()
        t_setup = clock()
        setup()
        probe.sync()
        memory["setup"] = _setup_point(probe)
        record["timing"]["setup_s"] = round(clock() - t_setup, 3)
        t_steps = clock()
        steps(recorder, snapshot)
        record["timing"]["steps_s"] = round(clock() - t_steps, 3)
        record["status"] = "ok"
    except BaseException as e:
        if recorder.current is not None:
            current = recorder.current
            oom_where = {"step": current["step"], "micro_batch": current["micro_batch"],
                         "phase": current["phase"]}
            recorder.end(completed=False)
        if not probe.is_oom(e):
            raise
        record.update(status="oom", oom=True, oom_at=oom_where,
                      reason=_truncate(f"{type(e).__name__}: {e}"))
        if memory["setup"] is None:  # OOM while building: the setup peak is the figure
            with contextlib.suppress(Exception):
                memory["setup"] = _setup_point(probe)
    finally:
        if snapshot is not None:
            snapshot.close()
            if snapshot.error is None and os.path.exists(snapshot.path):
                record["snapshot_file"] = os.path.basename(snapshot.path)
            elif snapshot.error:
                record["harness"]["snapshot_error"] = snapshot.error
        record["phases"] = recorder.phases
        _finish_memory(probe, record, smi)


def _setup_point(probe):
    return {**_point(probe), "peak_allocated_bytes": probe.peak_allocated(),
            "peak_reserved_bytes": probe.peak_reserved()}


def _finish_memory(probe, record, smi):
    memory = record["memory"]
    phases = record["phases"]
    if phases:
        memory["peak_allocated_bytes"] = max(p["peak_allocated_bytes"] for p in phases)
        memory["peak_reserved_bytes"] = max(p["peak_reserved_bytes"] for p in phases)
        memory["peak_device_used_bytes"] = max(p["end_device_used_bytes"] for p in phases)
    with contextlib.suppress(Exception):
        stats = probe.stats()
        memory["allocator_stats"] = loop.allocator_stats(stats)
        memory["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
        memory["num_ooms"] = int(stats.get("num_ooms", 0))
    if smi is not None:
        memory["nvidia_smi_process_bytes"] = smi(os.getpid())


def _truncate(text, limit=MAX_MESSAGE_CHARS):
    return text if len(text) <= limit else text[:limit] + " …[truncated]"


def write_json_atomic(path, obj):
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj), encoding="utf-8")
    os.replace(tmp, path)


def run_job(job_path, result_path):
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    cfg = job["config"]
    record = schema.new_record(cfg["id"], cfg["name"], cfg["knobs"], cfg.get("label"),
                               job.get("env") or envmod.capture_environment(), job["command"],
                               dict(job.get("harness", {})))
    record["plan"] = job["plan"]
    t_start = time.perf_counter()
    try:
        measure(job, job_path, record)
    except BaseException as e:  # noqa: BLE001  every failure becomes a record
        schema.mark_error(record, "exception",
                          _truncate(f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        print(traceback.format_exc(), file=sys.stderr)
    record["timing"]["wall_s"] = round(time.perf_counter() - t_start, 3)
    write_json_atomic(result_path, record)
    return 0


def probe_environment(result_path):
    try:
        import torch
    except ImportError:
        torch = None
    env = envmod.capture_environment(torch, probe_gpu=torch is not None)
    write_json_atomic(result_path, env)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="gtlib.worker", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--job", help="job JSON written by the driver")
    group.add_argument("--probe", metavar="RESULT", help="write the environment JSON and exit")
    group.add_argument("--prepare-4bit-source", nargs=2, metavar=("JOB", "DIR"))
    parser.add_argument("--result", help="where to write the result record (with --job)")
    args = parser.parse_args(argv)
    if args.probe:
        return probe_environment(args.probe)
    if args.prepare_4bit_source:
        prepare_4bit_source(*args.prepare_4bit_source)
        return 0
    if not args.result:
        parser.error("--job needs --result")
    return run_job(args.job, args.result)


if __name__ == "__main__":
    sys.exit(main())
