"""The commands as functions. Each builds the command line's flags from keyword
arguments and runs the command in the engine (vramscope._core), which parses
them with the CLI's own declarations and returns the library's result; the GIL
is released while it runs, and sweep and plan spread their estimates over
threads inside the engine.
"""

from __future__ import annotations

import os
import warnings

try:
    from . import _core
except ImportError as e:  # the recorder-only install (python/pyproject.toml)
    raise ImportError("vramscope's engine module (vramscope._core) is not installed here: "
                      "this is the recorder alone (vramscope.trace); `pip install .` at the "
                      "top of the repository installs the engine too") from e
from . import _peft
from ._errors import Error, InputError, InternalError
from ._knobs import check_keys, check_text, path_arg, to_flags
from ._model import object_knobs, resolve
from ._report import FitResult, Report, Result

# Output flags of the CLI: the Report / Result methods do their work here.
_OUTPUT_FLAGS = ("json", "html", "svg", "csv", "events", "markdown")


class VramscopeWarning(UserWarning):
    """A knob that is allowed but likely not meant (the CLI's `vramscope: warning:` lines)."""


def _run(command: str, args: list[str], files: dict | None = None, cls=Result):
    value = _engine(command, args, files or {})
    for line in value.warnings:
        warnings.warn(line, VramscopeWarning, stacklevel=3)
    return cls(value, command)


def _engine(command: str, args: list[str], files: dict):
    """_core.run_command with its errors as the API's own (vramscope._errors):
    the engine's refusal of an input is an InputError (a ValueError), anything
    else it raises an InternalError; only TypeError passes as it is."""
    for arg in args:
        check_text(arg, "argument")
    try:
        return _core.run_command(command, args, files)
    except TypeError:
        raise
    except ValueError as e:
        raise InputError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - the engine's bugs, whatever C++ threw
        raise InternalError(f"{type(e).__name__}: {e}") from e


def _resolve(model) -> tuple[str, dict]:
    """resolve(model), whose reading of a config or module object runs that
    object's own code: what it raises is a TypeError naming the argument."""
    try:
        return resolve(model)
    except (TypeError, ValueError, Error):
        raise
    except Exception as e:  # noqa: BLE001 - the caller's object failed to describe itself
        raise TypeError(f"model: a {type(model).__name__} that could not be read: {e}") from e


def _model_knobs(model, knobs: dict) -> dict:
    """What the model object says about itself (its dtypes, its LoRA, ...), then the knobs
    given, which win."""
    check_keys(knobs, _OUTPUT_FLAGS)
    return {**object_knobs(model), **knobs}


def _model_command(command: str, model, knobs: dict, cls=Result):
    knobs = _model_knobs(model, knobs)
    name, files = _resolve(model)
    return _run(command, [name] + to_flags(knobs), files, cls)


def estimate(model, **knobs) -> Report:
    """Predicts the memory of training `model` with `knobs` (`vramscope estimate MODEL ...`).

    model: a catalog alias ("llama-3-8b"), a Hugging Face id, a config.json path or a model
    directory, a transformers PretrainedConfig, or an nn.Module (on the meta device: its
    parameters' names, shapes and dtypes are read exactly). A module says knobs itself: bf16
    or fp16 weights are --precision bf16 / fp16, a PEFT model is LoRA (or QLoRA over 4-bit
    weights) with its adapters' rank, targets, dropout and dtype over its base weights,
    transformers' gradient checkpointing and attention implementation; knobs given win.
    knobs: the CLI's flags with underscores (batch=4, seq=2048, finetune="lora",
    grad_ckpt="full", gpu="a100-80g", zero=3, gpus=8, ...), and top=N, explain=True.
    Raises vramscope.InputError (a ValueError) with the CLI's message for a bad knob or
    model, TypeError for an argument of the wrong type; never anything else but
    vramscope.InternalError.
    """
    report = _model_command("estimate", model, knobs, Report)
    _peft.warn_if_trainable_differs(model, report)
    return report


def fit(model, **knobs) -> FitResult:
    """The largest micro-batch and the longest sequence that fit (`vramscope fit`); also
    margin="2GiB" or "5%", max_batch, max_seq, max_gpus. The result's max_batch, max_seq
    (max_image_size) and min_gpus are None where nothing fits; its data: `fit --json`."""
    return _model_command("fit", model, knobs, FitResult)


def sweep(model, **knobs) -> Result:
    """One estimate per grid point (`vramscope sweep`): seq, batch, lora_rank or grad_accum
    take a grid, "START:STOP:COUNT" or a list ([512, 1024, 2048]); the first one given is the
    x axis. Result keys: points, ..."""
    return _model_command("sweep", model, knobs)


def plan(model, **knobs) -> Result:
    """Training strategies ranked by tokens/s among those that fit (`vramscope plan`); also
    tokens_per_step, top. A knob given is a choice already made."""
    return _model_command("plan", model, knobs)


def simulate(trace: str | os.PathLike, **options) -> Report:
    """Replays an event-stream file (`vramscope simulate TRACE`, e.g. one written by
    vramscope.trace); options: gpu, alloc_conf, top, retain_graph_until_end."""
    check_keys(options, _OUTPUT_FLAGS)
    return _run("simulate", [path_arg(trace, "trace")] + to_flags(options), cls=Report)


def explain(snapshot: str | os.PathLike, **options) -> Report:
    """What a measured run allocated, from a PyTorch memory snapshot (`vramscope explain`);
    options: device, gpu, top. `report.data["snapshot"]` holds the snapshot analysis."""
    check_keys(options, _OUTPUT_FLAGS)
    return _run("explain", [path_arg(snapshot, "snapshot")] + to_flags(options), cls=Report)


def compare(snapshot: str | os.PathLike, model, device: int | None = None, **knobs) -> Result:
    """Measured (a memory snapshot) next to predicted (`estimate(model, **knobs)`), per total,
    category and phase (`vramscope compare SNAPSHOT -- MODEL knobs`)."""
    knobs = _model_knobs(model, knobs)
    name, files = _resolve(model)
    args = [path_arg(snapshot, "snapshot")] + to_flags({"device": device}) + ["--", name]
    args += to_flags(knobs)
    return _run("compare", args, files)


def models() -> list[dict]:
    """The model catalog: alias, hub_id, family, reference_parameters."""
    return _core.models()


def gpus() -> list[dict]:
    """The GPU catalog: name, display_name, total_bytes, usable_bytes."""
    return _core.gpus()
