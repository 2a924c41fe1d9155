"""Checking a prediction on the real run.

    with vramscope.check(model, optimizer, batch=8, seq=1024, record="results.jsonl") as chk:
        for step, batch in enumerate(loader):
            ...train...
            if step == 2:
                break
    chk.measured   # {"peak_allocated_bytes": ..., "peak_reserved_bytes": ...}

At the start it predicts the run (vramscope.estimate from the model itself, the
optimizer's kind and the knobs given; knobs given win) for the GPU it runs on
(torch.cuda.get_device_name; a GPU the catalog lacks: the entry of the nearest
memory, with a warning) and prints the prediction and what it assumed. At the
end it reads the allocator's peaks (torch.cuda.max_memory_allocated /
max_memory_reserved) and the device memory in use (torch.cuda.mem_get_info:
what nvidia-smi shows), prints each next to its own prediction (allocated,
reserved, device total) and appends one record in the `vramscope validate`
format (docs/groundtruth.md), so `vramscope validate results.jsonl` re-checks
it. On a CUDA out-of-memory error it writes a memory snapshot (when memory
history recording was on: torch.cuda.memory._record_memory_history) and
explains it.

It never stops training: without CUDA it warns once, predicts and measures
nothing; a model it cannot estimate is a warning, not an error.

The memory reader is injectable (`memory_reader=`: see vramscope._device), so
the check runs on CPU in tests.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

from . import _device, _model

_GIB = float(1 << 30)
# The knobs `vramscope validate` re-estimates from (src/plan/validate.cc); a record
# holds only these.
_VALIDATE_KNOBS = ("batch", "seq", "grad_accum", "steps", "lora_rank", "lora_dropout",
                   "precision", "optimizer", "finetune", "grad_ckpt", "attn", "loss",
                   "lora_targets", "lora_dtype", "impl", "alloc_conf")


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


def model_knobs(model) -> dict:
    """Knobs the model object says itself (vramscope._model.object_knobs): its weights'
    dtype, a PEFT model's LoRA or QLoRA, gradient checkpointing, the attention."""
    return _model.object_knobs(model)


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
        self.knobs = {**_object_knobs(model), **_optimizer_knobs(optimizer), **given}
        self.record_path = os.fspath(record) if record is not None else None
        self._reader_given = memory_reader
        self._reader_resolved = False
        self.reader = None
        self.out = out if out is not None else sys.stdout
        self.snapshot_path = snapshot_path
        self.prediction = None
        self.measured = None
        self.explained = None
        self.gpu = None  # the device measured: {"device_name", "total_bytes"}
        self.step = 0  # optimizer steps done, for an OOM record
        self._start = None
        self._context_bytes = None
        self._peak_device_used = None

    # -- the prediction ------------------------------------------------------
    def predict(self):
        """Estimates the run for the GPU it runs on (the gpu knob wins)."""
        from ._api import estimate
        mem = self._memory()
        self.gpu = _device.detected_gpu(mem) if mem is not None else None
        if self.gpu is not None and "gpu" not in self.knobs:
            self.knobs["gpu"] = self.gpu["device_name"]
            try:
                self.prediction = estimate(self.model, **self.knobs)
            except ValueError as e:
                if not str(e).startswith("gpu:"):
                    raise
                self.knobs["gpu"] = self._stand_in_gpu()
        if self.prediction is None:
            self.prediction = estimate(self.model, **self.knobs)
        self._print_prediction()
        return self.prediction

    def _stand_in_gpu(self) -> str | None:
        """The catalog GPU of the nearest memory, for a GPU the catalog does not know."""
        from ._api import gpus
        name = _device.nearest_catalog_gpu(self.gpu["total_bytes"], gpus())
        _device.warn_once(f"vramscope: {self.gpu['device_name']} is not in the GPU catalog; "
                          f"predicting for {name}, the entry of the nearest memory "
                          "(pass gpu=... to choose)")
        return name

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
        """The memory reader; None without CUDA (warned once: nothing is measured)."""
        if not self._reader_resolved:
            self.reader = _device.reader_for(self._reader_given, self.model)
            self._reader_resolved = True
        return self.reader

    def start(self):
        """Predicts (a failure warns, training goes on) and resets the peak counters."""
        self._start = time.monotonic()
        if self.prediction is None:
            try:
                self.predict()
            except Exception as e:  # noqa: BLE001 - the check must never stop training
                _device.warn_once(f"vramscope: no prediction: {type(e).__name__}: {e}")
        mem = self._memory()
        if mem is not None:
            used = _device.device_used(mem)
            reserved = getattr(mem, "memory_reserved", None)
            if used is not None and reserved is not None:
                # As the ground-truth harness measures it (docs/groundtruth.md): the device
                # in use minus PyTorch's reserved memory, before the steps.
                self._context_bytes = max(0, used - int(reserved()))
            mem.reset_peak_memory_stats()
        return self

    def sample(self) -> None:
        """Reads the device's memory in use (mem_get_info); the largest reading is compared
        with the predicted device total. The callback samples after every step."""
        mem = self._memory()
        used = _device.device_used(mem) if mem is not None else None
        if used is not None:
            self._peak_device_used = max(used, self._peak_device_used or 0)

    def finish(self, status: str = "ok", oom_at: dict | None = None) -> dict | None:
        """Reads the peaks, prints them next to the prediction, writes the record; None
        (nothing measured) without CUDA, no record without a prediction."""
        mem = self._memory()
        if mem is None:
            return None
        self.sample()
        self.measured = {"peak_allocated_bytes": int(mem.max_memory_allocated()),
                         "peak_reserved_bytes": int(mem.max_memory_reserved())}
        if self._peak_device_used is not None:
            self.measured["peak_device_used_bytes"] = self._peak_device_used
        if self.prediction is None:
            self._print_measured()
            return None
        self._print_comparison()
        rec = self.make_record(status, oom_at)
        if self.record_path:
            with open(self.record_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
        return rec

    def _print_measured(self):
        for key, value in self.measured.items():
            print(f"vramscope: {key.removesuffix('_bytes').replace('_', ' ')}: measured "
                  f"{value / _GIB:.2f} GiB", file=self.out)

    def _print_comparison(self):
        """Like with like: allocated with allocated, reserved with reserved, the device in use
        (mem_get_info, what nvidia-smi shows) with the predicted device total."""
        d = self.prediction.data
        for key, predicted_key, label in (
                ("peak_allocated_bytes", "peak_allocated_bytes", "peak allocated"),
                ("peak_reserved_bytes", "peak_reserved_bytes", "peak reserved"),
                ("peak_device_used_bytes", "device_total_bytes", "device used")):
            if key not in self.measured:
                continue
            measured, predicted = self.measured[key], d[predicted_key]
            error = (predicted - measured) / measured * 100 if measured else float("nan")
            print(f"vramscope: {label}: measured {measured / _GIB:.2f} GiB, predicted "
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
            "memory": self._memory_record(),
            "phases": [], "snapshot_file": None,
            "timing": {"wall_s": _elapsed(self._start), "setup_s": None, "steps_s": None},
            "env": _env(d["gpu"]["name"], self.gpu), "command": " ".join(sys.argv),
            "harness": {"name": "vramscope.check", "version": _version()},
        }

    def _memory_record(self) -> dict:
        memory = dict.fromkeys(("device_total_bytes", "cuda_context_bytes", "before_model",
                                "setup", "peak_device_used_bytes", "num_alloc_retries",
                                "num_ooms", "allocator_stats", "nvidia_smi_process_bytes"))
        memory.update(self.measured or {})
        memory["cuda_context_bytes"] = self._context_bytes
        if self.gpu is not None:
            memory["device_total_bytes"] = self.gpu["total_bytes"]
        return memory

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


def _object_knobs(model) -> dict:
    """model_knobs, or {} with a warning when the object cannot be read (training goes on;
    the prediction then says what it could not do)."""
    try:
        return model_knobs(model)
    except (ValueError, TypeError) as e:
        _device.warn_once(f"vramscope: {e}")
        return {}


def _optimizer_knobs(optimizer) -> dict:
    kind = optimizer_knob(optimizer)
    return {"optimizer": kind} if kind else {}


def _elapsed(start):
    return None if start is None else round(time.monotonic() - start, 3)


def _version():
    from . import __version__
    return __version__


def _env(gpu_name: str, detected: dict | None) -> dict:
    """`gpu.name`: the catalog GPU predicted for (`vramscope validate` re-estimates for it);
    `device_name` and `total_memory_bytes`: what torch.cuda reported, when it did."""
    packages = {}
    for name in ("torch", "transformers", "peft", "accelerate", "deepspeed"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            packages[name] = module.__version__
    gpu_present = False
    torch = sys.modules.get("torch")
    if torch is not None:
        gpu_present = bool(torch.cuda.is_available())
    gpu = {"name": gpu_name}
    if detected is not None:
        gpu.update(device_name=detected["device_name"],
                   total_memory_bytes=detected["total_bytes"])
    return {"python_version": platform.python_version(), "packages": packages,
            "gpu_present": gpu_present, "gpu": gpu}


def check(model, optimizer=None, **knobs) -> MemoryCheck:
    """A context manager around a training loop: `with vramscope.check(model, opt, batch=8,
    seq=1024, record="results.jsonl"): ...` (see MemoryCheck)."""
    return MemoryCheck(model, optimizer, **knobs)
