"""vramscope: predict the GPU memory of neural-network training.

    import vramscope
    report = vramscope.estimate("llama-3-8b", batch=4, seq=2048, finetune="lora")
    report.peak_allocated_bytes, report.fits, report.breakdown
    report.timeline_frame()       # pandas, when installed
    report.to_html("report.html")

The same engine as the `vramscope` command (installed with this package), with
the command's knob names as keyword arguments (dashes become underscores):
estimate, fit, sweep, plan, simulate, explain, compare. `vramscope.check` and
`vramscope.integrations.transformers.MemoryCheckCallback` compare a prediction
with the real run; `vramscope.trace` records a PyTorch program's memory events.

The engine module is loaded on first use, so `import vramscope.trace` works
where only the recorder is needed.
"""

__version__ = "0.1.0"

_API = {
    "estimate": "._api", "fit": "._api", "sweep": "._api", "plan": "._api",
    "simulate": "._api", "explain": "._api", "compare": "._api", "models": "._api",
    "gpus": "._api", "Report": "._report", "Result": "._report", "FitResult": "._report",
    "check": "._check", "MemoryCheck": "._check", "CheckWarning": "._device",
    "Error": "._errors", "InputError": "._errors", "InternalError": "._errors",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'vramscope' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
