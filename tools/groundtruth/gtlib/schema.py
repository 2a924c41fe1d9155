"""Result records (one JSON object per configuration) and their validator.

The schema is documented in docs/groundtruth.md; `validate_result` is the
executable form of that document. The harness validates every record before
writing it (an invalid worker record becomes an `error` record that says
why), and `vramscope validate` may rely on what is checked here.
"""

from __future__ import annotations

from . import knobs as K

SCHEMA_VERSION = 1
FORMAT = "vramscope-groundtruth"
STATUSES = ("ok", "oom", "skipped", "error")
ERROR_KINDS = ("timeout", "exception", "crash", "invalid-result")
PHASES = ("forward", "backward", "optimizer")
OOM_PHASES = ("setup",) + PHASES

PHASE_BYTE_FIELDS = (
    "peak_allocated_bytes", "peak_reserved_bytes",
    "begin_allocated_bytes", "begin_reserved_bytes",
    "end_allocated_bytes", "end_reserved_bytes", "end_device_used_bytes",
)
POINT_FIELDS = ("allocated_bytes", "reserved_bytes", "device_used_bytes")
SETUP_FIELDS = POINT_FIELDS + ("peak_allocated_bytes", "peak_reserved_bytes")
MEMORY_FIELDS = ("device_total_bytes", "cuda_context_bytes", "before_model", "setup",
                 "peak_allocated_bytes", "peak_reserved_bytes", "peak_device_used_bytes",
                 "num_alloc_retries", "num_ooms", "allocator_stats", "nvidia_smi_process_bytes")
MODEL_FIELDS = ("alias", "hub_id", "source", "model_type", "architecture", "parameters",
                "trainable_parameters", "parameter_bytes_by_dtype", "lora_modules", "applied")
TOP_FIELDS = ("schema_version", "format", "id", "name", "label", "knobs", "status", "reason",
              "error_kind", "oom", "oom_at", "model", "plan", "memory", "phases",
              "snapshot_file", "timing", "env", "command", "harness")


def new_record(config_id, name, knobs, label, env, command, harness):
    """A record with every field present; status 'error' until the caller sets it."""
    return {
        "schema_version": SCHEMA_VERSION,
        "format": FORMAT,
        "id": config_id,
        "name": name,
        "label": label,
        "knobs": knobs,
        "status": "error",
        "reason": None,
        "error_kind": None,
        "oom": False,
        "oom_at": None,
        "model": None,
        "plan": None,
        "memory": None,
        "phases": [],
        "snapshot_file": None,
        "timing": {"wall_s": None, "setup_s": None, "steps_s": None},
        "env": env,
        "command": command,
        "harness": harness,
    }


def mark_skipped(record, reason):
    record.update(status="skipped", reason=reason, error_kind=None, oom=False, oom_at=None)
    return record


def mark_error(record, kind, reason):
    assert kind in ERROR_KINDS, kind
    record.update(status="error", reason=reason, error_kind=kind, oom=False, oom_at=None)
    return record


def validate_result(rec):
    """Returns a list of problems ("field: what is wrong"); empty when `rec` is valid."""
    errors = []
    if not isinstance(rec, dict):
        return ["record: not a JSON object"]
    for field in TOP_FIELDS:
        if field not in rec:
            errors.append(f"{field}: missing")
    if errors:
        return errors
    if rec["schema_version"] != SCHEMA_VERSION:
        errors.append(f"schema_version: expected {SCHEMA_VERSION}, got {rec['schema_version']!r}")
    if rec["format"] != FORMAT:
        errors.append(f"format: expected {FORMAT!r}")
    _check_type(errors, "name", rec["name"], str)
    _check_type(errors, "label", rec["label"], (str, type(None)))
    _check_type(errors, "command", rec["command"], str)
    _check_type(errors, "harness", rec["harness"], dict)
    _check_knobs(errors, rec)
    status = rec["status"]
    if status not in STATUSES:
        errors.append(f"status: {status!r} is not one of {', '.join(STATUSES)}")
        return errors
    _check_type(errors, "oom", rec["oom"], bool)
    _check_type(errors, "reason", rec["reason"], (str, type(None)))
    if status != "ok" and not (isinstance(rec["reason"], str) and rec["reason"]):
        errors.append(f"reason: required for status {status}")
    if status == "error":
        if rec["error_kind"] not in ERROR_KINDS:
            errors.append(f"error_kind: must be one of {', '.join(ERROR_KINDS)} for status error")
    elif rec["error_kind"] is not None:
        errors.append("error_kind: must be null unless status is error")
    if (status == "oom") != (rec["oom"] is True):
        errors.append("oom: must be true exactly when status is oom")
    if status == "oom":
        _check_oom_at(errors, rec["oom_at"])
    elif rec["oom_at"] is not None:
        errors.append("oom_at: must be null unless status is oom")

    _check_type(errors, "env", rec["env"], dict)
    if isinstance(rec["env"], dict):
        for key in ("python_version", "packages", "gpu_present"):
            if key not in rec["env"]:
                errors.append(f"env.{key}: missing")
    _check_type(errors, "plan", rec["plan"], (dict, type(None)))
    _check_type(errors, "snapshot_file", rec["snapshot_file"], (str, type(None)))
    _check_timing(errors, rec["timing"])
    _check_phases(errors, rec["phases"], status)
    if status in ("ok", "oom"):
        _check_memory(errors, rec["memory"], status)
        _check_model(errors, rec["model"], required=(status == "ok"))
        if status == "ok":
            if rec["plan"] is None:
                errors.append("plan: required for status ok")
            env = rec["env"]
            if not (isinstance(env, dict) and env.get("gpu_present") is True):
                errors.append("env.gpu_present: an ok measurement needs a GPU")
    else:
        if rec["memory"] is not None:
            _check_memory(errors, rec["memory"], "oom")
        if rec["model"] is not None:
            _check_model(errors, rec["model"], required=False)
    return errors


def _check_type(errors, path, value, types):
    if isinstance(value, bool) and bool not in _as_tuple(types):
        errors.append(f"{path}: expected {_type_names(types)}, got a boolean")
    elif not isinstance(value, types):
        errors.append(f"{path}: expected {_type_names(types)}, got {type(value).__name__}")


def _as_tuple(types):
    return types if isinstance(types, tuple) else (types,)


def _type_names(types):
    return " or ".join("null" if t is type(None) else t.__name__ for t in _as_tuple(types))


def _check_bytes(errors, path, value, nullable=False, unit="bytes"):
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        errors.append(f"{path}: expected a non-negative integer ({unit}), got {value!r}")


def _check_knobs(errors, rec):
    knobs = rec["knobs"]
    try:
        canonical = K.normalize_knobs(knobs)
    except K.KnobError as e:
        errors.append(f"knobs: {e}")
        return
    if canonical != knobs:
        errors.append("knobs: not in canonical form (see gtlib.knobs.normalize_knobs)")
    elif rec["id"] != K.config_id(knobs):
        errors.append(f"id: {rec['id']!r} is not the id of these knobs ({K.config_id(knobs)})")


def _check_oom_at(errors, oom_at):
    if not isinstance(oom_at, dict):
        errors.append("oom_at: required object for status oom")
        return
    if oom_at.get("phase") not in OOM_PHASES:
        errors.append(f"oom_at.phase: must be one of {', '.join(OOM_PHASES)}")
    step = oom_at.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        errors.append("oom_at.step: expected an integer >= 0 (0 = setup)")


def _check_timing(errors, timing):
    if not isinstance(timing, dict):
        errors.append("timing: expected an object")
        return
    for key in ("wall_s", "setup_s", "steps_s"):
        value = timing.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            errors.append(f"timing.{key}: expected a number or null")


def _check_phases(errors, phases, status):
    if not isinstance(phases, list):
        errors.append("phases: expected a list")
        return
    if status == "ok" and not phases:
        errors.append("phases: an ok measurement has at least one phase")
    for i, ph in enumerate(phases):
        path = f"phases[{i}]"
        if not isinstance(ph, dict):
            errors.append(f"{path}: expected an object")
            continue
        if ph.get("phase") not in PHASES:
            errors.append(f"{path}.phase: must be one of {', '.join(PHASES)}")
        step = ph.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            errors.append(f"{path}.step: expected an integer >= 1")
        micro = ph.get("micro_batch")
        if micro is not None and (isinstance(micro, bool) or not isinstance(micro, int) or micro < 0):
            errors.append(f"{path}.micro_batch: expected an integer >= 0 or null")
        completed = ph.get("completed")
        if not isinstance(completed, bool):
            errors.append(f"{path}.completed: expected a boolean")
        elif status == "ok" and not completed:
            errors.append(f"{path}.completed: every phase of an ok measurement completes")
        for key in PHASE_BYTE_FIELDS:
            _check_bytes(errors, f"{path}.{key}", ph.get(key))
        duration = ph.get("duration_ms")
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration < 0:
            errors.append(f"{path}.duration_ms: expected a non-negative number")


def _check_point(errors, path, point, fields):
    if not isinstance(point, dict):
        errors.append(f"{path}: expected an object")
        return
    for key in fields:
        _check_bytes(errors, f"{path}.{key}", point.get(key), nullable=(key not in POINT_FIELDS))


def _check_memory(errors, mem, status):
    if not isinstance(mem, dict):
        errors.append(f"memory: required object for status {status}")
        return
    for key in MEMORY_FIELDS:
        if key not in mem:
            errors.append(f"memory.{key}: missing")
    if any(key not in mem for key in MEMORY_FIELDS):
        return
    _check_bytes(errors, "memory.device_total_bytes", mem["device_total_bytes"])
    # The context size is a difference of two readings; it may be null if unreadable.
    _check_bytes(errors, "memory.cuda_context_bytes", mem["cuda_context_bytes"], nullable=True)
    _check_point(errors, "memory.before_model", mem["before_model"], POINT_FIELDS)
    nullable = status != "ok"
    if mem["setup"] is not None or not nullable:
        _check_point(errors, "memory.setup", mem["setup"], SETUP_FIELDS)
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_device_used_bytes"):
        _check_bytes(errors, f"memory.{key}", mem[key], nullable=nullable)
    for key in ("num_alloc_retries", "num_ooms"):
        _check_bytes(errors, f"memory.{key}", mem[key], unit="count")
    _check_type(errors, "memory.allocator_stats", mem["allocator_stats"], dict)
    _check_bytes(errors, "memory.nvidia_smi_process_bytes", mem["nvidia_smi_process_bytes"],
                 nullable=True)
    if status == "ok" and mem["peak_reserved_bytes"] is not None and mem["peak_allocated_bytes"] is not None:
        if mem["peak_reserved_bytes"] < mem["peak_allocated_bytes"]:
            errors.append("memory.peak_reserved_bytes: smaller than peak_allocated_bytes")


def _check_model(errors, model, required):
    if model is None and not required:
        return
    if not isinstance(model, dict):
        errors.append("model: expected an object")
        return
    for key in MODEL_FIELDS:
        if key not in model:
            errors.append(f"model.{key}: missing")
    for key in ("parameters", "trainable_parameters"):
        if key in model:
            _check_bytes(errors, f"model.{key}", model[key], nullable=not required, unit="count")
    if "model_type" in model:
        _check_type(errors, "model.model_type", model["model_type"], str)
