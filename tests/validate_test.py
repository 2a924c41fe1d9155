"""End-to-end tests of `vramscope validate` on records made by the harness's own
schema code (tools/groundtruth/gtlib), so the C++ reader is checked against
what measure.py writes. The measured figures here are synthetic (derived from
the prediction to test the arithmetic); real ones live in data/groundtruth/.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
sys.path.insert(0, str(ROOT / "tools" / "groundtruth"))
from gtlib import knobs as K, schema  # noqa: E402

GIB = 1 << 30


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def predicted(knobs):
    flags = []
    for key, value in knobs.items():
        if key in ("model", "steps"):
            continue
        flags += [f"--{key.replace('_', '-')}", str(value)]
    # The versions record() writes in its environment: validate predicts with them,
    # and with what every harness run does (no attention mask, use_cache off, the
    # model built on the GPU from its config).
    p = run("estimate", knobs["model"], "--gpu", "h100-80g", "--steps", str(knobs["steps"]),
            "--transformers-version", "4.57", "--torch-version", "2.11", "--json",
            "--no-attention-mask", "--no-use-cache", "--built-on-gpu", *flags)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def record(user_knobs, status="ok", scale=1.0):
    k = K.normalize_knobs(user_knobs)
    env = {"python_version": "3.12", "gpu_present": True,
           "packages": {"torch": "2.11.0+cu128", "transformers": "4.57.1"},
           "gpu": {"name": "NVIDIA H100 80GB HBM3", "total_memory_bytes": 85017755648}}
    rec = schema.new_record(K.config_id(k), K.config_name(k), k, None, env,
                            "python3 tools/groundtruth/measure.py --grid t.toml --out t.jsonl",
                            {"version": "test"})
    if status in ("skipped", "error"):
        if status == "skipped":
            return schema.mark_skipped(rec, "flash-attn is not installed")
        return schema.mark_error(rec, "timeout", "killed after 600 s")
    p = predicted(k)
    alloc = int(p["peak_allocated_bytes"] * scale)
    reserved = int(p["peak_reserved_bytes"] * scale)
    device = int(p["device_total_bytes"] * scale)  # reserved + the catalog's CUDA context
    point = {"allocated_bytes": 0, "reserved_bytes": 0, "device_used_bytes": 600 << 20}
    rec.update(
        status="ok", plan={"plan_version": 1},
        model={"alias": k["model"], "hub_id": None, "source": "data/models", "model_type": "gpt2",
               "architecture": "x", "parameters": p["model"]["parameters"],
               "trainable_parameters": p["model"]["trainable_parameters"],
               "parameter_bytes_by_dtype": {}, "lora_modules": None, "applied": {}},
        memory={"device_total_bytes": 85017755648, "cuda_context_bytes": 500 << 20,
                "before_model": point, "setup": {**point, "peak_allocated_bytes": 1,
                                                 "peak_reserved_bytes": 1},
                "peak_allocated_bytes": alloc, "peak_reserved_bytes": reserved,
                "peak_device_used_bytes": device, "num_alloc_retries": 0,
                "num_ooms": 0, "allocator_stats": {}, "nvidia_smi_process_bytes": None},
        phases=[{"step": 1, "micro_batch": 0, "phase": "forward", "completed": True,
                 "begin_allocated_bytes": 0, "begin_reserved_bytes": 0,
                 "peak_allocated_bytes": alloc, "peak_reserved_bytes": reserved,
                 "end_allocated_bytes": 0, "end_reserved_bytes": reserved,
                 "end_device_used_bytes": device, "duration_ms": 1.0}])
    assert schema.validate_result(rec) == [], schema.validate_result(rec)
    return rec


def write(tmp_path, records, name="r.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


THRESHOLDS = str(ROOT / "data" / "groundtruth" / "thresholds.json")


def test_exact_predictions_pass_the_gate(tmp_path):
    recs = [record({"model": "gpt2", "seq": 128, "batch": 2}),
            record({"model": "qwen2.5-0.5b", "seq": 256, "optimizer": "sgd"}),
            record({"model": "gpt2", "seq": 128, "attn": "flash"}, status="skipped")]
    path = write(tmp_path, recs)
    p = run("validate", str(path), "--thresholds", THRESHOLDS)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Accuracy gate: passed" in p.stdout
    assert "flash-attn is not installed" in p.stdout
    j = json.loads(run("validate", str(path), "--json").stdout)
    assert j["summary"]["peak_allocated"]["count"] == 2
    assert j["summary"]["peak_allocated"]["max_abs_error"] < 1e-6
    assert len(j["not_compared"]) == 1


def test_under_estimate_fails_the_gate_with_exit_3(tmp_path):
    # Measured 10% above the prediction: an under-estimate of 1 - 1/1.1 = 9.1%.
    path = write(tmp_path, [record({"model": "gpt2", "seq": 128}, scale=1.10)])
    p = run("validate", str(path), "--thresholds", THRESHOLDS, "--json")
    assert p.returncode == 3, p.stderr
    j = json.loads(p.stdout)
    err = j["rows"][0]["relative_error"]["peak_allocated"]
    assert err == pytest.approx(1 / 1.1 - 1, abs=1e-6)
    assert any("under-estimate of 9.09%" in f for f in j["threshold_failures"])


def test_folder_argument_reads_every_jsonl(tmp_path):
    write(tmp_path, [record({"model": "gpt2", "seq": 64})], "a.jsonl")
    write(tmp_path, [record({"model": "gpt2", "seq": 96})], "b.jsonl")
    (tmp_path / "notes.md").write_text("not a result file")
    j = json.loads(run("validate", str(tmp_path), "--json").stdout)
    assert [r["where"].split("/")[-1] for r in j["rows"]] == ["a.jsonl:1", "b.jsonl:1"]


@pytest.mark.parametrize("content, message", [
    ("{not json\n", "r.jsonl:1: line: not valid JSON"),
    ('{"format": "vramscope-groundtruth", "schema_version": 9}\n', "schema_version"),
    ("[1, 2]\n", "record: not a JSON object"),
])
def test_bad_result_files_exit_2_with_one_line(tmp_path, content, message):
    path = tmp_path / "r.jsonl"
    path.write_text(content)
    p = run("validate", str(path))
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and message in p.stderr, p.stderr


def test_bad_thresholds_exit_2(tmp_path):
    path = write(tmp_path, [record({"model": "gpt2", "seq": 64})])
    bad = tmp_path / "t.json"
    bad.write_text('{"peak_allocated": {"median_abs_error": "tight"}}')
    p = run("validate", str(path), "--thresholds", str(bad))
    assert p.returncode == 2 and "peak_allocated.median_abs_error" in p.stderr


def test_rows_name_the_knobs_that_differ(tmp_path):
    # Two configurations with long names that differ only late in the knob list
    # (issue 18: truncated names could not be told apart).
    recs = [record({"model": "qwen2.5-0.5b", "seq": 256, "optimizer": "sgd", "grad_ckpt": gc})
            for gc in ("none", "full")]
    p = run("validate", str(write(tmp_path, recs)))
    assert p.returncode == 0, p.stderr
    rows = [l for l in p.stdout.splitlines() if l.startswith("grad_ckpt=")]
    assert len(rows) == 2
    assert rows[0].startswith("grad_ckpt=none ") and rows[1].startswith("grad_ckpt=full ")
    every = next(l for l in p.stdout.splitlines() if l.startswith("Every row: "))
    assert "model=qwen2.5-0.5b" in every and "seq=256" in every and "optimizer=sgd" in every
