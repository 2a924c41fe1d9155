"""Result-record validation: the executable form of docs/groundtruth.md's schema."""

import copy
import json

import pytest

from gtlib import knobs, schema

GIB = 1 << 30


def phase(step, name, micro=0, peak=3 * GIB):
    return {"step": step, "micro_batch": None if name == "optimizer" else micro, "phase": name,
            "completed": True, "begin_allocated_bytes": GIB, "begin_reserved_bytes": 2 * GIB,
            "peak_allocated_bytes": peak, "peak_reserved_bytes": peak + GIB,
            "end_allocated_bytes": GIB, "end_reserved_bytes": 2 * GIB,
            "end_device_used_bytes": 5 * GIB, "duration_ms": 12.5}


def ok_record():
    k = knobs.normalize_knobs({"model": "gpt2", "seq": 128})
    rec = schema.new_record(knobs.config_id(k), knobs.config_name(k), k, None,
                            {"python_version": "3.12.3", "packages": {}, "gpu_present": True},
                            "python3 measure.py --grid g.toml --out o.jsonl", {"version": "1.0"})
    point = {"allocated_bytes": GIB, "reserved_bytes": 2 * GIB, "device_used_bytes": 3 * GIB}
    rec.update(
        status="ok",
        plan={"plan_version": 1},
        model={"alias": "gpt2", "hub_id": "openai-community/gpt2", "source": "data/models/gpt2.json",
               "model_type": "gpt2", "architecture": "GPT2LMHeadModel", "parameters": 124439808,
               "trainable_parameters": 124439808, "parameter_bytes_by_dtype": {"float32": 497759232},
               "lora_modules": None, "applied": {}},
        memory={"device_total_bytes": 80 * GIB, "cuda_context_bytes": 500 << 20,
                "before_model": point, "setup": {**point, "peak_allocated_bytes": GIB,
                                                 "peak_reserved_bytes": 2 * GIB},
                "peak_allocated_bytes": 3 * GIB, "peak_reserved_bytes": 4 * GIB,
                "peak_device_used_bytes": 5 * GIB, "num_alloc_retries": 0, "num_ooms": 0,
                "allocator_stats": {"num_alloc_retries": 0}, "nvidia_smi_process_bytes": None},
        phases=[phase(s, n) for s in (1, 2, 3) for n in ("forward", "backward", "optimizer")],
        timing={"wall_s": 9.5, "setup_s": 2.0, "steps_s": 1.0},
    )
    return rec


def test_valid_ok_record():
    assert schema.validate_result(ok_record()) == []
    assert schema.validate_result(json.loads(json.dumps(ok_record()))) == []


def mutate(fn):
    rec = ok_record()
    fn(rec)
    return schema.validate_result(rec)


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("memory"), "memory: missing"),
    (lambda r: r.update(schema_version=2), "schema_version"),
    (lambda r: r.update(status="fine"), "status"),
    (lambda r: r.update(id="000000000000"), "is not the id of these knobs"),
    (lambda r: r["knobs"].update(batch=0), "knobs: knob 'batch'"),
    (lambda r: r["knobs"].update(lora_rank=8), "not in canonical form"),
    (lambda r: r["memory"].update(peak_allocated_bytes=-1), "memory.peak_allocated_bytes"),
    (lambda r: r["memory"].update(peak_reserved_bytes=GIB), "smaller than peak_allocated"),
    (lambda r: r["memory"]["before_model"].pop("reserved_bytes"), "memory.before_model.reserved_bytes"),
    (lambda r: r["memory"].update(num_ooms=True), "memory.num_ooms"),
    (lambda r: r["phases"][0].update(phase="update"), "phases[0].phase"),
    (lambda r: r["phases"][1].update(completed=False), "phases[1].completed"),
    (lambda r: r["phases"][2].update(duration_ms="fast"), "phases[2].duration_ms"),
    (lambda r: r["phases"][2].update(step=0), "phases[2].step"),
    (lambda r: r.update(phases=[]), "at least one phase"),
    (lambda r: r["env"].update(gpu_present=False), "needs a GPU"),
    (lambda r: r.update(oom=True), "oom: must be true exactly when"),
    (lambda r: r.update(error_kind="timeout"), "error_kind: must be null"),
    (lambda r: r["model"].pop("parameters"), "model.parameters: missing"),
    (lambda r: r.update(timing={"wall_s": "x"}), "timing.wall_s"),
    (lambda r: r.update(plan=None), "plan: required"),
])
def test_invalid_records_name_the_field(change, message):
    problems = mutate(change)
    assert problems, "expected a problem"
    assert any(message in p for p in problems), problems


def test_oom_record():
    rec = ok_record()
    rec["phases"][-1]["completed"] = False
    rec.update(status="oom", oom=True, reason="CUDA out of memory. Tried to allocate 2.00 GiB",
               oom_at={"step": 3, "micro_batch": None, "phase": "optimizer"})
    assert schema.validate_result(rec) == []
    rec["oom_at"] = None
    assert any("oom_at" in p for p in schema.validate_result(rec))


def test_oom_during_setup_allows_missing_peaks():
    rec = ok_record()
    rec.update(status="oom", oom=True, reason="CUDA out of memory", phases=[], model=None,
               oom_at={"step": 0, "micro_batch": None, "phase": "setup"})
    rec["memory"].update(peak_allocated_bytes=None, peak_reserved_bytes=None,
                         peak_device_used_bytes=None)
    assert schema.validate_result(rec) == []


def test_skipped_and_error_records():
    k = knobs.normalize_knobs({"model": "gpt2"})
    env = {"python_version": "3.11", "packages": {}, "gpu_present": False}
    rec = schema.new_record(knobs.config_id(k), knobs.config_name(k), k, "lbl", env, "cmd", {})
    assert any("reason" in p for p in schema.validate_result(rec))  # error without a reason
    skipped = schema.mark_skipped(copy.deepcopy(rec), "needs bitsandbytes")
    assert schema.validate_result(skipped) == []
    err = schema.mark_error(copy.deepcopy(rec), "timeout", "no result within 600 s")
    assert schema.validate_result(err) == []
    err["error_kind"] = "boom"
    assert any("error_kind" in p for p in schema.validate_result(err))


def test_not_an_object():
    assert schema.validate_result([1]) == ["record: not a JSON object"]
