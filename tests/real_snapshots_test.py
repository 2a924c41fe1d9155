"""Real PyTorch memory snapshots (data/groundtruth/snapshots/, taken on an H100 by the
ground-truth harness) read by `explain` and `compare`.

The harness recorded each snapshot during step 2 and, in the same process, torch's own
counters for every phase. The snapshot reader's peaks must equal torch's
max_memory_allocated() / max_memory_reserved() over step 2 to the byte: evidence about the
reader from a real run, not from our own output.
"""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
DATA = ROOT / "data" / "groundtruth"
SNAPSHOTS = sorted((DATA / "snapshots").glob("*/*.pickle"))


def record_of(snapshot):
    """The ground-truth record measured in the same process as `snapshot`."""
    results = DATA / (snapshot.parent.name + ".jsonl")
    for line in results.read_text().splitlines():
        rec = json.loads(line)
        if rec["id"] == snapshot.stem:
            return rec
    raise AssertionError(f"no record {snapshot.stem} in {results}")


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_there_are_real_snapshots():
    assert len(SNAPSHOTS) >= 5


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.stem)
def test_explain_peaks_equal_torch_counters_over_the_recorded_step(snapshot):
    rec = record_of(snapshot)
    step2 = [ph for ph in rec["phases"] if ph["step"] == 2]
    assert step2, "the harness snapshots step 2"
    explained = json.loads(run("explain", str(snapshot), "--json"))
    assert explained["peak_allocated_bytes"] == max(ph["peak_allocated_bytes"] for ph in step2)
    assert explained["peak_reserved_bytes"] == max(ph["peak_reserved_bytes"] for ph in step2)


@pytest.mark.parametrize("snapshot", [s for s in SNAPSHOTS if record_of(s)["status"] == "ok"],
                         ids=lambda p: p.stem)
def test_compare_with_the_prediction_of_the_same_knobs(snapshot):
    rec = record_of(snapshot)
    knobs = rec["knobs"]
    args = ["compare", str(snapshot), "--json", "--", knobs["model"], "--no-attention-mask",
            "--no-use-cache", "--transformers-version", "5.17", "--torch-version", "2.11"]
    for key in ("batch", "seq", "grad_accum", "precision", "optimizer", "finetune", "lora_rank",
                "lora_targets", "grad_ckpt", "attn", "loss", "alloc_conf"):
        if knobs.get(key) not in (None, ""):
            args += ["--" + key.replace("_", "-"), str(knobs[key])]
    cmp = json.loads(run(*args))
    totals = cmp["totals"]["peak_allocated_bytes"]
    step2 = max(ph["peak_allocated_bytes"] for ph in rec["phases"] if ph["step"] == 2)
    assert totals["measured_bytes"] == step2
    # The accuracy gate's limit for peak allocated (data/groundtruth/thresholds.json).
    limit = json.loads((DATA / "thresholds.json").read_text())["peak_allocated"]["max_abs_error"]
    error = totals["predicted_bytes"] / totals["measured_bytes"] - 1
    assert abs(error) <= limit, (snapshot.stem, error)
