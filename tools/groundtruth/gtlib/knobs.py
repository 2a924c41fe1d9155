"""Training-setup knobs of a measurement: names, allowed values, defaults.

The names and values are those of `vramscope estimate` (shared/DESIGN.md,
"Knobs"), with flags written as snake_case keys (`--grad-accum` is
`grad_accum`). `steps` is the one knob of the harness alone: how many
optimizer steps a measurement runs.

`normalize_knobs` turns user input (a grid entry) into the canonical form that
results record and ids are computed from; it raises KnobError naming the knob
and the problem. Pure Python, no torch.

The data-parallel knobs (DIST_KNOBS: `ddp = true`, `zero = 1|2|3`, `fsdp =
"full"|"grad-op"` and their options, `estimate --gpus 1 --zero 3 ...`) run the
library with world size 1 on the one GPU (gtlib/dist_plan.py). They appear in
the canonical knobs only when a library is named, so every configuration
without one keeps the id it always had.
"""

from __future__ import annotations

import hashlib
import json

PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "fp16", "bf16")
OPTIMIZERS = (
    "none", "sgd", "sgd-momentum", "adamw", "adamw-foreach", "adamw-fused",
    "adamw-forloop", "adamw-8bit", "paged-adamw-8bit", "paged-adamw",
    "adafactor", "lion",
)
FINETUNES = ("full", "lora", "qlora")
GRAD_CKPT = ("none", "full", "reentrant")
ATTNS = ("eager", "sdpa", "flash")
LOSSES = ("hf", "chunked", "fused-linear")
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down", "lm_head")
ALL_LINEAR = "all-linear"

# Data-parallel knobs, named as `vramscope estimate`'s flags (docs/parallel.md).
DIST_KNOBS = (
    "gpus", "ddp", "zero", "offload", "no_zero_init", "zero_buckets", "fsdp",
    "fsdp_version", "fsdp_wrap", "fsdp_backward_prefetch",
)
# Canonical order: how knobs appear in results and in a configuration's name.
KNOB_ORDER = (
    "model", "batch", "seq", "grad_accum", "precision", "optimizer",
    "finetune", "lora_rank", "lora_targets", "lora_dropout", "grad_ckpt",
    "attn", "loss", "alloc_conf", *DIST_KNOBS, "steps",
)
LORA_KNOBS = ("lora_rank", "lora_targets", "lora_dropout")
# Boolean knobs: `estimate` flags that take no value (`--ddp`, `--no-zero-init`).
FLAG_KNOBS = ("ddp", "no_zero_init")

ZERO_STAGES = (1, 2, 3)
OFFLOADS = ("none", "optimizer", "params")
ZERO_BUCKETS = ("deepspeed", "hf-auto")
FSDP_SHARDING = ("full", "grad-op")
FSDP_VERSIONS = (1, 2)
FSDP_WRAPS = ("trainer", "layers")
FSDP_PREFETCH = ("none", "pre", "post")
# Defaults of the estimate flags (docs/parallel.md, "Flags"); filled in only for the
# library a configuration names.
DIST_DEFAULTS = {
    "gpus": 1, "offload": "none", "no_zero_init": False, "zero_buckets": "deepspeed",
    "fsdp_version": 2, "fsdp_wrap": "trainer", "fsdp_backward_prefetch": "none",
}

# Defaults of `vramscope estimate` (DESIGN.md); `model` has none.
DEFAULTS = {
    "batch": 1,
    "seq": 2048,
    "grad_accum": 1,
    "precision": "bf16-mixed",
    "optimizer": "adamw",
    "finetune": "full",
    "lora_rank": 16,
    "lora_targets": "q,v",
    "lora_dropout": 0.05,
    "grad_ckpt": "none",
    "attn": "sdpa",
    "loss": "hf",
    "alloc_conf": "",
    "steps": 3,
}

_ENUMS = {
    "precision": PRECISIONS,
    "optimizer": OPTIMIZERS,
    "finetune": FINETUNES,
    "grad_ckpt": GRAD_CKPT,
    "attn": ATTNS,
    "loss": LOSSES,
}
# Upper bounds keep a hostile or mistyped grid from asking for absurd work.
_INT_LIMITS = {
    "batch": (1, 4096),
    "seq": (1, 1 << 20),
    "grad_accum": (1, 1024),
    "lora_rank": (1, 65536),
    "steps": (1, 100),
}


class KnobError(ValueError):
    """A knob is unknown or has a value outside its allowed set."""


def _int_knob(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise KnobError(f"knob '{name}' must be an integer, got {value!r}")
    low, high = _INT_LIMITS[name]
    if not low <= value <= high:
        raise KnobError(f"knob '{name}' must be in [{low}, {high}], got {value}")
    return value


def _lora_targets(value):
    """Accepts "q,v", ["q", "v"] or "all-linear"; returns the canonical string."""
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        items = [v.strip() for v in value]
    else:
        raise KnobError(
            f"knob 'lora_targets' must be a string like \"q,v\" or a list of names, got {value!r}")
    items = [i for i in items if i]
    if not items:
        raise KnobError("knob 'lora_targets' is empty")
    if ALL_LINEAR in items:
        if len(items) != 1:
            raise KnobError("knob 'lora_targets': 'all-linear' cannot be combined with other names")
        return ALL_LINEAR
    unknown = [i for i in items if i not in LORA_TARGETS]
    if unknown:
        raise KnobError(
            f"knob 'lora_targets': unknown module name(s) {unknown} "
            f"(known: {', '.join(LORA_TARGETS)} or {ALL_LINEAR})")
    return ",".join(t for t in LORA_TARGETS if t in items)


def _split_top_level(text):
    """Splits on commas outside [...] (roundup_power2_divisions:[256:1,>:8])."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise KnobError(f"knob 'alloc_conf': unbalanced ']' in {text!r}")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if depth != 0:
        raise KnobError(f"knob 'alloc_conf': unbalanced '[' in {text!r}")
    parts.append(current)
    return parts


_ALLOC_KEY_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_ALLOC_VALUE_CHARS = _ALLOC_KEY_CHARS | set(".:[],>+-")


def _alloc_conf(value):
    """Checks PYTORCH_CUDA_ALLOC_CONF syntax (key:value[,key:value]) and strips spaces.

    Keys are not checked against PyTorch's list (it grows between releases);
    PyTorch itself rejects unknown keys when the worker starts CUDA.
    """
    if not isinstance(value, str):
        raise KnobError(f"knob 'alloc_conf' must be a string, got {value!r}")
    if len(value) > 1000:
        raise KnobError("knob 'alloc_conf' is longer than 1000 characters")
    compact = "".join(value.split())
    canonical = []
    for part in _split_top_level(compact):
        if not part:
            continue
        key, sep, val = part.partition(":")
        if not sep or not key or not val:
            raise KnobError(
                f"knob 'alloc_conf': '{part}' is not key:value "
                "(example: expandable_segments:True)")
        if not set(key) <= _ALLOC_KEY_CHARS or not set(val) <= _ALLOC_VALUE_CHARS:
            raise KnobError(f"knob 'alloc_conf': unexpected characters in '{part}'")
        canonical.append(f"{key}:{val}")
    return ",".join(canonical)


def normalize_knobs(raw):
    """Validates `raw` (a dict of knob name -> value) and returns the canonical dict.

    Missing knobs take DEFAULTS; `model` is required. LoRA knobs are dropped
    when finetune is "full" (they change nothing there), so two entries that
    differ only in them are the same configuration. Keys follow KNOB_ORDER.
    """
    if not isinstance(raw, dict):
        raise KnobError(f"a configuration must be a table of knobs, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(KNOB_ORDER))
    if unknown:
        raise KnobError(f"unknown knob(s) {unknown} (known: {', '.join(KNOB_ORDER)})")
    merged = dict(DEFAULTS)
    merged.update(raw)
    if "model" not in merged:
        raise KnobError("knob 'model' is required (a catalog alias, Hugging Face id or config.json path)")

    out = {}
    model = merged["model"]
    if not isinstance(model, str) or not model.strip() or len(model) > 500:
        raise KnobError(f"knob 'model' must be a non-empty string, got {model!r}")
    out["model"] = model.strip()
    for name in ("batch", "seq", "grad_accum"):
        out[name] = _int_knob(name, merged[name])
    for name in ("precision", "optimizer", "finetune"):
        out[name] = _enum_knob(name, merged[name])
    if out["finetune"] != "full":
        out["lora_rank"] = _int_knob("lora_rank", merged["lora_rank"])
        out["lora_targets"] = _lora_targets(merged["lora_targets"])
        dropout = merged["lora_dropout"]
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise KnobError(f"knob 'lora_dropout' must be a number in [0, 1), got {dropout!r}")
        out["lora_dropout"] = float(dropout)
    for name in ("grad_ckpt", "attn", "loss"):
        out[name] = _enum_knob(name, merged[name])
    out["alloc_conf"] = _alloc_conf(merged["alloc_conf"])
    out.update(_dist_knobs(raw))
    out["steps"] = _int_knob("steps", merged["steps"])
    return out


def _bool_knob(name, value):
    if not isinstance(value, bool):
        raise KnobError(f"knob '{name}' must be true or false, got {value!r}")
    return value


def _dist_library(given):
    """The one data-parallel library `given` names: "ddp", "zero", "fsdp" or None."""
    named = []
    if _bool_knob("ddp", given.get("ddp", False)):
        named.append("ddp")
    for name in ("zero", "fsdp"):
        if given.get(name) is not None:
            named.append(name)
    if len(named) > 1:
        raise KnobError(f"knobs {', '.join(named)}: name one data-parallel library, not several")
    return named[0] if named else None


def _dist_knobs(raw):
    """The canonical data-parallel knobs of `raw`: {} when it names no library.

    `gpus = 1` alone is the default (one GPU, no library) and is dropped. The
    combinations `vramscope estimate` refuses are refused here too
    (src/lower/parallel_layout.cc ValidateLayout): offload without ZeRO or FSDP,
    offload of parameters with ZeRO-1/2.
    """
    given = {k: raw[k] for k in DIST_KNOBS if k in raw}
    library = _dist_library(given)
    gpus = given.get("gpus", DIST_DEFAULTS["gpus"])
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus != 1:
        raise KnobError(f"knob 'gpus' must be 1: the harness runs one process on one GPU "
                        f"(world size 1), got {gpus!r}")
    if library is None:
        extra = sorted(set(given) - {"gpus", "ddp"})
        if extra:
            raise KnobError(f"knob(s) {extra} need a data-parallel library: ddp = true, "
                            "zero = 1|2|3 or fsdp = \"full\"|\"grad-op\"")
        return {}
    allowed = {"ddp": {"gpus", "ddp"},
               "zero": {"gpus", "zero", "offload", "no_zero_init", "zero_buckets"},
               "fsdp": {"gpus", "fsdp", "offload", "fsdp_version", "fsdp_wrap",
                        "fsdp_backward_prefetch"}}[library]
    stray = sorted(k for k in set(given) - allowed
                   if not (k == "ddp" and given[k] is False))
    if stray:
        raise KnobError(f"knob(s) {stray} do not apply to {library}")
    merged = {**DIST_DEFAULTS, **given}
    out = {"gpus": 1}
    if library == "ddp":
        out["ddp"] = True
        return out
    offload = _choice("offload", merged["offload"], OFFLOADS)
    if library == "zero":
        stage = merged["zero"]
        if isinstance(stage, bool) or stage not in ZERO_STAGES:
            raise KnobError(f"knob 'zero' must be 1, 2 or 3, got {stage!r}")
        if offload == "params" and stage != 3:
            raise KnobError("knob 'offload': DeepSpeed offloads parameters only with zero = 3")
        no_init = _bool_knob("no_zero_init", merged["no_zero_init"])
        if no_init and stage != 3:
            raise KnobError("knob 'no_zero_init' applies to zero = 3 only")
        out.update(zero=stage, offload=offload)
        if stage == 3:
            out["no_zero_init"] = no_init
        out["zero_buckets"] = _choice("zero_buckets", merged["zero_buckets"], ZERO_BUCKETS)
        return out
    out["fsdp"] = _choice("fsdp", merged["fsdp"], FSDP_SHARDING)
    out["offload"] = offload
    version = merged["fsdp_version"]
    if isinstance(version, bool) or version not in FSDP_VERSIONS:
        raise KnobError(f"knob 'fsdp_version' must be 1 or 2, got {version!r}")
    out["fsdp_version"] = version
    out["fsdp_wrap"] = _choice("fsdp_wrap", merged["fsdp_wrap"], FSDP_WRAPS)
    prefetch = _choice("fsdp_backward_prefetch", merged["fsdp_backward_prefetch"], FSDP_PREFETCH)
    if version == 1:
        out["fsdp_backward_prefetch"] = prefetch
    elif prefetch != "none":
        raise KnobError("knob 'fsdp_backward_prefetch' is FSDP1's (fsdp_version = 1)")
    return {k: out[k] for k in KNOB_ORDER if k in out}


def _choice(name, value, allowed):
    if value not in allowed:
        raise KnobError(f"knob '{name}' must be one of {', '.join(map(str, allowed))}; "
                        f"got {value!r}")
    return value


def _enum_knob(name, value):
    allowed = _ENUMS[name]
    if value not in allowed:
        raise KnobError(f"knob '{name}' must be one of {', '.join(allowed)}; got {value!r}")
    return value


def config_id(knobs):
    """Stable id of a canonical knob dict: 12 hex digits of SHA-256 of its JSON."""
    text = json.dumps(knobs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def config_name(knobs):
    """Human-readable one-line name: "model=gpt2 batch=4 ..." in KNOB_ORDER."""
    return " ".join(f"{k}={knobs[k]}" for k in KNOB_ORDER if k in knobs)


def estimate_flags(knobs):
    """The `vramscope estimate` command-line flags equivalent to `knobs`.

    Boolean knobs are flags without a value, given only when true; `offload`
    is left out at its default, as `estimate` would show it.
    """
    flags = [knobs["model"]]
    for key in KNOB_ORDER[1:]:
        if key not in knobs:
            continue
        value = knobs[key]
        if (key == "alloc_conf" and not value) or (key == "offload" and value == "none"):
            continue
        flag = "--" + key.replace("_", "-")
        if key in FLAG_KNOBS:
            flags += [flag] if value else []
        else:
            flags += [flag, str(value)]
    return flags
