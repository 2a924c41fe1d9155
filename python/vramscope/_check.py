"""Checking a prediction on the real run.

    with vramscope.check(model, optimizer, batch=8, seq=1024, record="results.jsonl") as chk:
        for step, batch in enumerate(loader):
            ...train...
            if step == 2:
                break
    chk.measured   # {"peak_allocated_bytes": ..., "peak_reserved_bytes": ...}

At the start it predicts the run (vramscope.estimate from the model itself, the
optimizer's kind and the knobs given; knobs given win) and prints the
prediction and what it assumed. At the end it reads the allocator's peaks
(torch.cuda.max_memory_allocated / max_memory_reserved), prints them next to
the prediction and appends one record in the `vramscope validate` format
(docs/groundtruth.md), so `vramscope validate results.jsonl` re-checks it. On
a CUDA out-of-memory error it writes a memory snapshot (when memory history
recording was on: torch.cuda.memory._record_memory_history) and explains it.

The memory reader is injectable (`memory_reader=`: anything with
max_memory_allocated(), max_memory_reserved(), reset_peak_memory_stats()), so
the check runs on CPU in tests.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

from . import _model

_GIB = float(1 << 30)
# The knobs `vramscope validate` re-estimates from (src/plan/validate.cc); a record
# holds only these.
_VALIDATE_KNOBS = ("batch", "seq", "grad_accum", "steps", "lora_rank", "lora_dropout",
                   "precision", "optimizer", "finetune", "grad_ckpt", "attn", "loss",
                   "lora_targets", "alloc_conf")


def optimizer_knob(optimizer) -> str | None:
    """The --optimizer value of a torch / bitsandbytes optimizer object; None if unknown."""
    if optimizer is None:
        return None
    name = type(getattr(optimizer, "optimizer", optimizer)).__name__  # accelerate wraps it
    defaults = getattr(getattr(optimizer, "optimizer", optimizer), "defaults", {}) or {}
    if name == "AdamW" and "foreach" in defaults:  # torch.optim.AdamW
        if defaults.get("fused"):
            return "adamw-fused"
        return "adamw-forloop" if defaults.get("foreach") is False else "adamw"
    table = {"AdamW8bit": "adamw-8bit", "PagedAdamW8bit": "paged-adamw-8bit",
             "PagedAdamW": "paged-adamw", "Adafactor": "adafactor", "Lion": "lion",
             "Lion8bit": "lion"}
    if name == "SGD":
        return "sgd-momentum" if defaults.get("momentum") else "sgd"
    return table.get(name)


def _is_peft(model) -> bool:
    return isinstance(getattr(model, "peft_config", None), dict) and bool(model.peft_config)


def estimate_input(model):
    """What to estimate for `model`: the object itself, except a PEFT model (LoRA layers
    wrapped around the base ones, maybe quantized), which is its base config with the LoRA
    knobs (model_knobs), as the engine lowers LoRA and QLoRA from the knobs."""
    if _is_peft(model) and getattr(model, "config", None) is not None:
        return model.config
    return model


def model_knobs(model) -> dict:
    """Knobs the model object says itself: LoRA (a PEFT model) and gradient checkpointing."""
    knobs = {}
    if _is_peft(model):
        cfg = next(iter(model.peft_config.values()))
        if getattr(cfg, "r", None):
            quantized = getattr(model, "is_loaded_in_4bit", False) or \
                getattr(getattr(model, "base_model", None), "is_loaded_in_4bit", False)
            knobs["finetune"] = "qlora" if quantized else "lora"
            knobs["lora_rank"] = int(cfg.r)
            knobs["lora_dropout"] = float(getattr(cfg, "lora_dropout", 0.0) or 0.0)
            targets = _lora_targets(getattr(cfg, "target_modules", None))
            if targets:
                knobs["lora_targets"] = targets
    if _checkpointing(model):
        knobs["grad_ckpt"] = "full"
    return knobs


class MemoryCheck:
    """A prediction of a run and, once it has run, the comparison (see the module's doc)."""

    def __init__(self, model, optimizer=None, *, record=None, memory_reader=None, out=None,
                 snapshot_path=None, knobs=None, **more_knobs):
        """`optimizer`: the optimizer object (its kind becomes the --optimizer knob), or the
        knob's value as a string; `knobs` and `more_knobs`: the CLI's knobs (given ones win
        over what the model and optimizer objects say)."""
        self.model = model
        given = {**(knobs or {}), **more_knobs}
        if isinstance(optimizer, str):
            given.setdefault("optimizer", optimizer)
            optimizer = None
        self.knobs = {**model_knobs(model), **_optimizer_knobs(optimizer), **given}
        self.record_path = os.fspath(record) if record is not None else None
        self.reader = memory_reader
        self.out = out if out is not None else sys.stdout
        self.snapshot_path = snapshot_path
        self.prediction = None
        self.measured = None
        self.explained = None
        self.step = 0  # optimizer steps done, for an OOM record
        self._start = None

    # -- the prediction ------------------------------------------------------
    def predict(self):
        from ._api import estimate
        self.prediction = estimate(estimate_input(self.model), **self.knobs)
        self._print_prediction()
        return self.prediction

    def _print_prediction(self):
        d = self.prediction.data
        print(f"vramscope: predicted on {d['gpu']['name']}: peak allocated "
              f"{d['peak_allocated_bytes'] / _GIB:.2f} GiB, peak reserved "
              f"{d['peak_reserved_bytes'] / _GIB:.2f} GiB, device total "
              f"{d['device_total_bytes'] / _GIB:.2f} GiB "
              f"({'fits' if d['fits'] else 'does not fit'})", file=self.out)
        print("vramscope: assumed:", file=self.out)
        for a in d.get("assumptions", []):
            flag = f" ({a['flag']})" if a.get("flag") else ""
            print(f"  {a['what']}: {a['assumed']}{flag}", file=self.out)

    # -- the measurement -----------------------------------------------------
    def _memory(self):
        if self.reader is None:
            import torch
            self.reader = torch.cuda
        return self.reader

    def start(self):
        self._start = time.monotonic()
        if self.prediction is None:
            self.predict()
        self._memory().reset_peak_memory_stats()
        return self

    def finish(self, status: str = "ok", oom_at: dict | None = None) -> dict:
        """Reads the peaks, prints them next to the prediction, writes the record."""
        mem = self._memory()
        self.measured = {"peak_allocated_bytes": int(mem.max_memory_allocated()),
                         "peak_reserved_bytes": int(mem.max_memory_reserved())}
        self._print_comparison()
        rec = self.make_record(status, oom_at)
        if self.record_path:
            with open(self.record_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
        return rec

    def _print_comparison(self):
        d = self.prediction.data
        for key, label in (("peak_allocated_bytes", "allocated"),
                           ("peak_reserved_bytes", "reserved")):
            measured, predicted = self.measured[key], d[key]
            error = (predicted - measured) / measured * 100 if measured else float("nan")
            print(f"vramscope: peak {label}: measured {measured / _GIB:.2f} GiB, predicted "
                  f"{predicted / _GIB:.2f} GiB ({error:+.1f}%)", file=self.out)

    def on_oom(self, error) -> None:
        """Dumps a memory snapshot (when history recording was on) and explains it."""
        import torch
        print(f"vramscope: out of memory: {str(error).splitlines()[0]}", file=self.out)
        path = self.snapshot_path or "vramscope-oom-snapshot.pickle"
        try:
            torch.cuda.memory._dump_snapshot(path)
        except Exception as e:  # noqa: BLE001 - recording was off or unsupported
            print(f"vramscope: no snapshot ({e}); turn on "
                  "torch.cuda.memory._record_memory_history() to get one", file=self.out)
            return
        from ._api import explain
        self.explained = explain(path)
        print(self.explained.text(), file=self.out)

    # -- the record ------------------------------------------------------------
    def make_record(self, status="ok", oom_at=None) -> dict:
        """One record of `vramscope validate`'s input (docs/groundtruth.md)."""
        d = self.prediction.data
        knobs = {k: v for k, v in self.knobs.items() if k in _VALIDATE_KNOBS}
        if isinstance(knobs.get("lora_targets"), (list, tuple)):
            knobs["lora_targets"] = ",".join(knobs["lora_targets"])
        knobs["model"] = self._model_name()
        name = f"{d['model']['name']}-b{d['knobs'].get('batch', '')}-s{d['knobs'].get('seq', '')}"
        return {
            "schema_version": 1, "format": "vramscope-groundtruth",
            "id": f"{name}-{int(time.time() * 1000)}", "name": name, "label": "vramscope.check",
            "knobs": knobs, "status": status,
            "reason": None if status == "ok" else "CUDA out of memory",
            "error_kind": None, "oom": status == "oom", "oom_at": oom_at,
            "model": {"alias": None, "hub_id": None, "source": knobs["model"],
                      "model_type": None, "architecture": d["model"]["architecture"],
                      "parameters": d["model"]["parameters"],
                      "trainable_parameters": d["model"]["trainable_parameters"],
                      "parameter_bytes_by_dtype": {}, "lora_modules": None, "applied": {}},
            "plan": {"prediction": {k: d[k] for k in ("peak_allocated_bytes",
                                                      "peak_reserved_bytes",
                                                      "device_total_bytes")},
                     "knobs": d["knobs"]},
            "memory": {**dict.fromkeys(("device_total_bytes", "cuda_context_bytes",
                                        "before_model", "setup", "peak_device_used_bytes",
                                        "num_alloc_retries", "num_ooms", "allocator_stats",
                                        "nvidia_smi_process_bytes")), **(self.measured or {})},
            "phases": [], "snapshot_file": None,
            "timing": {"wall_s": _elapsed(self._start), "setup_s": None, "steps_s": None},
            "env": _env(d["gpu"]["name"]), "command": " ".join(sys.argv),
            "harness": {"name": "vramscope.check", "version": _version()},
        }

    def _model_name(self) -> str:
        """A MODEL that `vramscope validate` can resolve: the name given, else the config
        written next to the record (an in-memory model has no name on disk)."""
        if isinstance(self.model, (str, os.PathLike)):
            return os.fspath(self.model)
        config = self.model if _model._is_config(self.model) else getattr(self.model, "config")
        base = os.path.splitext(self.record_path or "vramscope-check")[0]
        directory = os.path.abspath(base + ".model")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
            f.write(config.to_json_string(use_diff=False))
        return directory

    def oom_at(self) -> dict:
        """Where the run failed, as far as known: the optimizer step in progress (`step`,
        which a caller may keep up to date); the phase is not known, forward is assumed."""
        return {"step": self.step + 1, "phase": "forward"}

    # -- the context manager ----------------------------------------------------
    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and type(exc).__name__ == "OutOfMemoryError":
            self.on_oom(exc)
            self.finish("oom", self.oom_at())
            return False
        if exc is None:
            self.finish()
        return False


# PEFT target module names -> --lora-targets names.
_LORA_TARGETS = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate",
                 "up_proj": "up", "down_proj": "down", "lm_head": "lm_head"}


def _lora_targets(modules) -> str | None:
    """--lora-targets for PEFT's target_modules; None when a name has no knob value."""
    if isinstance(modules, str):
        return "all-linear" if modules == "all-linear" else None
    names = [_LORA_TARGETS.get(m) for m in (modules or [])]
    if not names or None in names:
        return None
    order = list(_LORA_TARGETS.values())
    return ",".join(sorted(set(names), key=order.index))


def _checkpointing(model) -> bool:
    """transformers' flag (is_activation_checkpointing since 5.x, is_gradient_checkpointing
    before)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), name) or name in getattr(model, "__dict__", {}):
            return bool(getattr(model, name))
    return False


def _optimizer_knobs(optimizer) -> dict:
    kind = optimizer_knob(optimizer)
    return {"optimizer": kind} if kind else {}


def _elapsed(start):
    return None if start is None else round(time.monotonic() - start, 3)


def _version():
    from . import __version__
    return __version__


def _env(gpu_name: str) -> dict:
    packages = {}
    for name in ("torch", "transformers", "peft", "accelerate", "deepspeed"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            packages[name] = module.__version__
    gpu_present = False
    torch = sys.modules.get("torch")
    if torch is not None:
        gpu_present = bool(torch.cuda.is_available())
    return {"python_version": platform.python_version(), "packages": packages,
            "gpu_present": gpu_present, "gpu": {"name": gpu_name}}


def check(model, optimizer=None, **knobs) -> MemoryCheck:
    """A context manager around a training loop: `with vramscope.check(model, opt, batch=8,
    seq=1024, record="results.jsonl"): ...` (see MemoryCheck)."""
    return MemoryCheck(model, optimizer, **knobs)
