"""A transformers Trainer callback that checks vramscope's prediction on the real run.

    from vramscope.integrations.transformers import MemoryCheckCallback
    check = MemoryCheckCallback(check_after_steps=3, record="results.jsonl")
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[check])
    with check.oom_guard():          # optional: explain a CUDA out-of-memory error
        trainer.train()

At train start it predicts the run from the Trainer's own model, arguments
(batch, accumulation, precision, optimizer, gradient checkpointing) and, when
present, the DeepSpeed or FSDP configuration, the sequence length from the
first batch; it prints the prediction and what it assumed. After step N it
compares with torch.cuda.max_memory_allocated() / max_memory_reserved() and
writes one record in the `vramscope validate` format. Knobs given to the
callback win over what it reads from the Trainer.
"""

from __future__ import annotations

import contextlib
import json
import os

from transformers import TrainerCallback

from .._check import MemoryCheck, optimizer_knob
from .._device import warn_once
from .._model import attn_knob, grad_ckpt_knob as _model_grad_ckpt

# TrainingArguments.optim -> --optimizer (when the optimizer object is not known).
_OPTIM = {"adamw_torch": "adamw", "adamw_torch_fused": "adamw-fused",
          "adamw_torch_foreach": "adamw", "adamw_bnb_8bit": "adamw-8bit",
          "adamw_8bit": "adamw-8bit", "paged_adamw_8bit": "paged-adamw-8bit",
          "paged_adamw_32bit": "paged-adamw", "adafactor": "adafactor", "sgd": "sgd",
          "lion_32bit": "lion", "lion_8bit": "lion"}
_FSDP = {"full_shard": "full", "shard_grad_op": "grad-op", "hybrid_shard": "hybrid"}


def _weights_dtype(model) -> str:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).replace("torch.", "")
    return "float32"


def precision_knob(args, model) -> str:
    weights = _weights_dtype(model)
    if weights in ("bfloat16", "float16"):
        return "bf16" if weights == "bfloat16" else "fp16"
    if getattr(args, "bf16", False):
        return "bf16-mixed"
    return "fp16-mixed" if getattr(args, "fp16", False) else "fp32"


def grad_ckpt_knob(args, model) -> str | None:
    if not getattr(args, "gradient_checkpointing", False):
        return _model_grad_ckpt(model)  # enabled on the model itself, before the Trainer
    kwargs = getattr(args, "gradient_checkpointing_kwargs", None) or {}
    reentrant = kwargs.get("use_reentrant")
    if reentrant is None:  # transformers' default: reentrant before 5.0, not since
        import transformers
        reentrant = int(transformers.__version__.split(".")[0]) < 5
    return "reentrant" if reentrant else "full"


def _deepspeed_config(args) -> dict | None:
    ds = getattr(args, "hf_deepspeed_config", None)
    if ds is not None and getattr(ds, "config", None):
        return ds.config
    ds = getattr(args, "deepspeed", None)
    if isinstance(ds, dict):
        return ds
    if isinstance(ds, str):
        with open(ds, encoding="utf-8") as f:
            return json.load(f)
    return None


def parallel_knobs(args) -> dict:
    """--gpus and --zero / --fsdp / --ddp, --offload from DeepSpeed, FSDP or plain DDP."""
    world = int(getattr(args, "world_size", 1) or 1)
    knobs = {"gpus": world} if world > 1 else {}
    ds = _deepspeed_config(args)
    zero = (ds or {}).get("zero_optimization", {}) or {}
    if zero.get("stage"):
        knobs["zero"] = int(zero["stage"])
        if (zero.get("offload_param") or {}).get("device") in ("cpu", "nvme"):
            knobs["offload"] = "params"
        elif (zero.get("offload_optimizer") or {}).get("device") in ("cpu", "nvme"):
            knobs["offload"] = "optimizer"
        return knobs
    fsdp = [str(getattr(o, "value", o)) for o in (getattr(args, "fsdp", None) or [])]
    mode = next((_FSDP[o] for o in fsdp if o in _FSDP), None)
    if mode:
        knobs["fsdp"] = mode
        version = (getattr(args, "fsdp_config", None) or {}).get("version")
        if version:
            knobs["fsdp_version"] = int(version)
        if "offload" in fsdp:
            knobs["offload"] = "params"
    elif world > 1:
        knobs["ddp"] = True
    return knobs


def _seq_from(dataloader) -> int | None:
    """The sequence length of the first batch (a peek with a fresh iterator)."""
    if dataloader is None:
        return None
    try:
        batch = next(iter(dataloader))
    except Exception:  # noqa: BLE001 - an unpeekable loader: the seq knob decides
        return None
    ids = batch.get("input_ids") if isinstance(batch, dict) else None
    return int(ids.shape[-1]) if ids is not None and hasattr(ids, "shape") else None


def trainer_knobs(args, model, optimizer=None, train_dataloader=None) -> dict:
    """The knobs a Trainer's own arguments, model and optimizer say."""
    knobs = {"batch": int(args.per_device_train_batch_size),
             "grad_accum": int(args.gradient_accumulation_steps),
             "precision": precision_knob(args, model)}
    optimizer_kind = optimizer_knob(optimizer) or _OPTIM.get(str(getattr(args.optim, "value",
                                                                         args.optim)))
    for key, value in (("optimizer", optimizer_kind), ("grad_ckpt", grad_ckpt_knob(args, model)),
                       ("seq", _seq_from(train_dataloader)), ("attn", attn_knob(model))):
        if value is not None:
            knobs[key] = value
    knobs.update(parallel_knobs(args))
    return knobs


class MemoryCheckCallback(TrainerCallback):
    """Predict at train start, measure after `check_after_steps` optimizer steps. It never
    stops training: without CUDA it warns once and only predicts; an error of its own is a
    warning."""

    def __init__(self, check_after_steps: int = 3, record=None, memory_reader=None, out=None,
                 snapshot_path=None, **knobs):
        self.steps = int(check_after_steps)
        self.options = {"record": record, "memory_reader": memory_reader, "out": out,
                        "snapshot_path": snapshot_path}
        self.knobs = knobs
        self.check: MemoryCheck | None = None
        self.record: dict | None = None  # None when nothing was measured (no CUDA)
        self.finished = False

    def on_train_begin(self, args, state, control, model=None, optimizer=None,
                       train_dataloader=None, **kwargs):
        try:
            knobs = {**trainer_knobs(args, model, optimizer, train_dataloader),
                     "steps": self.steps, **self.knobs}
            self.check = MemoryCheck(model, optimizer, knobs=knobs, **self.options)
            if not state.is_world_process_zero:
                self.check.out = open(os.devnull, "w", encoding="utf-8")  # one rank prints
            self.check.start()
        except Exception as e:  # noqa: BLE001 - a check must never stop training
            warn_once(f"vramscope: the memory check is off: {type(e).__name__}: {e}")
            self.check = None

    def on_step_end(self, args, state, control, **kwargs):
        if self.check is None or self.record is not None or self.finished:
            return
        self.check.step = state.global_step
        try:
            self.check.sample()
            if state.global_step >= self.steps:
                self.finished = True
                self.record = self.check.finish()
        except Exception as e:  # noqa: BLE001 - a check must never stop training
            warn_once(f"vramscope: the memory check is off: {type(e).__name__}: {e}")
            self.check = None

    @contextlib.contextmanager
    def oom_guard(self):
        """Around trainer.train(): on a CUDA out-of-memory error, dump and explain a snapshot
        (when memory history recording was on), write an `oom` record, and re-raise."""
        try:
            yield self
        except Exception as e:
            if type(e).__name__ == "OutOfMemoryError" and self.check is not None:
                self.check.on_oom(e)
                self.record = self.check.finish("oom", self.check.oom_at())
            raise
