"""End-to-end tests of explain / replay / compare on PyTorch memory snapshots.

The snapshots are tests/data/snapshots/*, written by
tests/snapshots/make_snapshots.py in the structure torch.cuda.memory._dump_snapshot()
writes; facts.json holds what that generator's allocator counted. Hostile and
malformed files are tests/bad_inputs/snapshot/*.

Run by ctest with VRAMSCOPE_BIN set to the built binary.
"""
import json
import os
import pathlib
import pickle
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
DATA = ROOT / "tests" / "data" / "snapshots"
BAD = sorted((ROOT / "tests" / "bad_inputs" / "snapshot").iterdir())
FACTS = json.loads((DATA / "facts.json").read_text())
MiB = 1 << 20
CATEGORIES = {"parameters", "gradients", "optimizer_state", "activations", "loss",
              "temporaries", "communication", "workspace", "other"}


def run(*args, timeout=30):
    start = time.monotonic()
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT)
    return p, time.monotonic() - start


def run_json(*args):
    p, _ = run(*args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def trace_of(name):
    # Our own generated test files: trusted, so the stdlib unpickler may load them.
    with open(DATA / name, "rb") as f:
        return pickle.load(f)["device_traces"][0]


def test_explain_text_report():
    p, seconds = run("explain", DATA / "train_p4.pickle")
    assert p.returncode == 0, p.stderr
    assert "GiB" in p.stdout
    assert "Breakdown at the peak" in p.stdout
    assert "optimizer state" in p.stdout
    assert "Largest allocation sites alive at the peak" in p.stdout
    assert seconds < 5


@pytest.mark.parametrize("name", ["train_p2.pickle", "train_p4.pickle", "train_p5.pickle"])
def test_explain_peaks_equal_what_the_run_counted(name):
    r = run_json("explain", DATA / name)
    assert r["command"] == "explain"
    assert r["peak_allocated_bytes"] == FACTS["train"]["peak_allocated_bytes"]
    assert r["peak_reserved_bytes"] == FACTS["train"]["peak_reserved_bytes"]
    assert set(r["breakdown_at_peak"]) == CATEGORIES
    assert sum(r["breakdown_at_peak"].values()) == r["peak_allocated_bytes"]
    assert r["peak_allocated_bytes"] <= r["peak_reserved_bytes"] <= r["device_total_bytes"]
    for key in ("fits", "gpu", "phases", "ranks", "top_allocations", "explanation", "notes"):
        assert key in r
    s = r["snapshot"]
    assert s["format"].startswith("pickle protocol")
    assert s["trace_entries"] == 278
    assert s["end_allocated_bytes"] == s["segments_allocated_bytes"]
    assert s["end_reserved_bytes"] == s["segments_reserved_bytes"]
    assert s["top_sites"] and s["top_sites"][0]["bytes"] > 0


def test_explain_requested_peak_matches_the_trace_replayed_in_python():
    # Independent of vramscope: requested bytes rise at "alloc" and fall at
    # "free_completed", exactly as PyTorch's requested_bytes stat.
    requested = peak = 0
    live = {}
    for e in trace_of("train_p4.pickle"):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            requested += e["size"]
            peak = max(peak, requested)
        elif e["action"] == "free_completed":
            requested -= live.pop(e["addr"])
    r = run_json("explain", DATA / "train_p4.pickle")
    assert r["snapshot"]["peak_requested_bytes"] == peak


def test_explain_phases_and_categories():
    r = run_json("explain", DATA / "train_p4.pickle")
    phases = [(p["step"], p["phase"]) for p in r["phases"]]
    assert phases == [(0, "setup"), (1, "forward"), (1, "backward"), (1, "optimizer"),
                      (2, "forward"), (2, "backward"), (2, "optimizer")]
    b = r["breakdown_at_peak"]
    assert b["parameters"] == b["gradients"] > 100 * MiB
    assert b["optimizer_state"] == 2 * b["parameters"]
    assert b["workspace"] == 2 * 8519680
    assert r["peak"]["phase"] == "optimizer"


def test_explain_json_and_pickle_agree():
    a = run_json("explain", DATA / "train_1step.json")
    b = run_json("explain", DATA / "train_1step_p4.pickle")
    assert a["snapshot"]["format"] == "json"
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "breakdown_at_peak", "phases"):
        assert a[key] == b[key]


def test_explain_oom_snapshot():
    r = run_json("explain", DATA / "oom.pickle")
    assert r["fits"] is False
    oom = r["oom"]
    assert oom is not None
    assert oom["requested_bytes"] > 0
    assert oom["device_limit_bytes"] == FACTS["oom"]["limit_bytes"]
    assert oom["phase"] == "optimizer"
    assert "CUDA out of memory" in oom["message"]
    assert r["peak_allocated_bytes"] == FACTS["oom"]["peak_allocated_bytes"]
    assert r["snapshot"]["live_at_oom"]
    assert sum(r["snapshot"]["breakdown_at_oom"].values()) == oom["allocated_bytes"]
    assert any(line.startswith("Why:") for line in r["explanation"])
    p, _ = run("explain", DATA / "oom.pickle")
    assert p.returncode == 0 and "Out of memory at trace entry" in p.stdout


def test_explain_wrapped_trace():
    full = run_json("explain", DATA / "train_p4.pickle")
    r = run_json("explain", DATA / "wrapped.pickle")
    s = r["snapshot"]
    assert s["trace_entries"] == 150
    assert s["initially_live_blocks"] > 0 and s["initial_reserved_bytes"] > 0
    assert r["peak_allocated_bytes"] == full["peak_allocated_bytes"]
    assert any("starts mid-run" in line for line in r["explanation"])


def test_explain_segments_only():
    r = run_json("explain", DATA / "segments_only.pickle")
    assert r["snapshot"]["trace_entries"] == 0
    assert r["peak_allocated_bytes"] == r["snapshot"]["segments_allocated_bytes"]


# The same run in the structure of each torch generation (docs/snapshot.md,
# "Structure by release"): every command reads each, and measures its peaks.
@pytest.mark.parametrize("name", ["torch2_0.pickle", "torch2_1.pickle", "newest.pickle"])
def test_every_torch_generation_measures_the_run(name):
    r = run_json("explain", DATA / name)
    assert r["peak_allocated_bytes"] == FACTS["train"]["peak_allocated_bytes"]
    assert r["peak_reserved_bytes"] == FACTS["train"]["peak_reserved_bytes"]
    assert r["snapshot"]["has_frames"]
    rp = run_json("replay", DATA / name)["replay"]
    measured = rp["measured_peak_reserved_bytes"]
    assert abs(rp["baseline_peak_reserved_bytes"] - measured) <= 0.01 * measured
    p, _ = run("compare", DATA / name, "--", "gpt2", "--json")
    assert p.returncode == 0, p.stderr


def test_torch_1_13_segment_list_with_history():
    r = run_json("explain", DATA / "torch1_13.pickle")
    assert r["snapshot"]["trace_entries"] == 0
    assert r["peak_allocated_bytes"] == r["snapshot"]["segments_allocated_bytes"] > 0
    assert r["snapshot"]["has_frames"] is False  # no trace: stacks come from blocks only


def test_explain_writes_html_svg_csv(tmp_path):
    html, svg, csv = tmp_path / "r.html", tmp_path / "r.svg", tmp_path / "r.csv"
    p, _ = run("explain", DATA / "train_p4.pickle", "--json", "--html", html, "--svg", svg,
               "--csv", csv)
    assert p.returncode == 0, p.stderr
    assert html.read_text().startswith("<!DOCTYPE html>") or "<html" in html.read_text()
    assert "<svg" in svg.read_text()
    assert csv.read_text().startswith("event_index,")


@pytest.mark.parametrize("name", ["train_p4.pickle", "train_1step.json", "oom.pickle",
                                  "wrapped.pickle"])
def test_replay_with_own_settings_is_within_one_percent(name):
    r = run_json("replay", DATA / name)
    rp = r["replay"]
    measured = rp["measured_peak_reserved_bytes"]
    assert abs(rp["baseline_peak_reserved_bytes"] - measured) <= 0.01 * measured
    assert r["peak_reserved_bytes"] == rp["predicted_peak_reserved_bytes"]
    assert r["command"] == "replay"


def test_replay_with_other_settings():
    r = run_json("replay", DATA / "oom.pickle", "--alloc-conf", "expandable_segments:True")
    rp = r["replay"]
    assert rp["alloc_conf"] == "expandable_segments:True"
    assert rp["predicted_peak_reserved_bytes"] != rp["baseline_peak_reserved_bytes"]
    assert r["knobs"]["alloc_conf"] == "expandable_segments:True"
    p, _ = run("replay", DATA / "train_p4.pickle", "--alloc-conf", "max_split_size_mb:40")
    assert p.returncode == 0, p.stderr
    assert "Replayed with 'max_split_size_mb:40'" in p.stdout


def test_compare_text_and_json():
    p, seconds = run("compare", DATA / "train_p4.pickle", "--", "llama-3-8b", "--seq", "512",
                     "--finetune", "lora")
    assert p.returncode == 0, p.stderr
    assert "measured" in p.stdout and "predicted" in p.stdout and "GiB" in p.stdout
    assert seconds < 5
    r = run_json("compare", DATA / "train_p4.pickle", "--", "llama-3-8b", "--seq", "512")
    assert r["command"] == "compare"
    assert r["model"] == "llama-3-8b"
    assert set(r["breakdown_at_peak"]) == CATEGORIES
    t = r["totals"]["peak_allocated_bytes"]
    assert t["measured_bytes"] == FACTS["train"]["peak_allocated_bytes"]
    assert t["predicted_bytes"] > t["measured_bytes"]
    assert t["difference_bytes"] == t["predicted_bytes"] - t["measured_bytes"]
    assert [ph["phase"] for ph in r["phases"]] == ["setup", "forward", "backward", "optimizer"]
    assert r["knobs"]["seq"] == "512"
    # --json after the -- works too.
    p, _ = run("compare", DATA / "train_p4.pickle", "--", "llama-3-8b", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["command"] == "compare"


BAD_ARGS = [
    ["explain"],
    ["explain", "/nonexistent/snapshot.pickle"],
    ["explain", ROOT / "tests"],
    ["explain", DATA / "train_p4.pickle", "--device", "3"],
    ["explain", DATA / "train_p4.pickle", "--gpu", "gtx-480"],
    ["replay", DATA / "train_p4.pickle", "--alloc-conf", "bogus_key:1"],
    ["replay", DATA / "train_p4.pickle", "--alloc-conf", "max_split_size_mb:-3"],
    ["compare", DATA / "train_p4.pickle"],
    ["compare", DATA / "train_p4.pickle", "--", "no-such-model-xyz"],
    ["compare", DATA / "train_p4.pickle", "--", "llama-3-8b", "--precision", "fp8"],
    ["compare", DATA / "train_p4.pickle", "--", "llama-3-8b", "--frobnicate"],
    ["compare", DATA / "train_p4.pickle", "--", "--seq", "512"],
]


@pytest.mark.parametrize("args", BAD_ARGS, ids=lambda a: " ".join(map(str, a))[-60:])
def test_bad_arguments_exit_2_with_one_line(args):
    p, seconds = run(*args)
    assert p.returncode == 2, (p.returncode, p.stdout[-300:], p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vramscope: error:"), p.stderr
    assert seconds < 5


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
@pytest.mark.parametrize("command", ["explain", "replay", "compare"])
def test_bad_snapshots_exit_2_with_one_line(path, command):
    args = [command, path]
    if command == "compare":
        args += ["--", "llama-3-8b"]
    p, seconds = run(*args)
    assert p.returncode == 2, (p.returncode, p.stdout[-300:], p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vramscope: error:"), p.stderr
    assert path.name in lines[0]  # the message names the file
    assert seconds < 5


def test_hostile_pickles_name_the_problem():
    expectations = {
        "global_reduce.pickle": "GLOBAL",
        "stack_global.pickle": "STACK_GLOBAL",
        "reduce_eval.pickle": "STACK_GLOBAL",
        "inst.pickle": "INST",
        "persid.pickle": "PERSID",
        "unknown_opcode.pickle": "unknown pickle opcode",
        "deep_nesting.pickle": "max_depth",
        "deep.json": "max_depth",
        "huge_string_length.pickle": "exceeds",
        "memo_cycle_list.pickle": "contains itself",
        "memo_cycle_dict.pickle": "contains itself",
        "memo_cycle_pair.pickle": "contains itself",
        "truncated_half.pickle": "truncated",
        "negative_size.pickle": "size: -5 is negative",
    }
    for name, text in expectations.items():
        p, _ = run("explain", ROOT / "tests" / "bad_inputs" / "snapshot" / name)
        assert p.returncode == 2
        assert text in p.stderr, (name, p.stderr)


def test_an_oom_snapshot_is_judged_against_its_own_device():
    # Issue 18: not against the default H100. The device had what the allocator held
    # plus what was free when the allocation failed (the oom entry's device_free).
    for command in ("explain", "replay"):
        p = subprocess.run([BIN, command, str(ROOT / "tests/data/snapshots/oom.pickle"), "--json"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        j = json.loads(p.stdout)
        ctx = j["device_view"]["cuda_context_bytes"]
        measured = json.loads(subprocess.run(
            [BIN, "explain", str(ROOT / "tests/data/snapshots/oom.pickle"), "--json"],
            capture_output=True, text=True, timeout=60).stdout)["oom"]
        assert j["gpu"]["usable_bytes"] == measured["device_limit_bytes"] + ctx < 2 << 30
        assert "the snapshot's device 0" in j["gpu"]["display_name"]
    text = subprocess.run([BIN, "explain", str(ROOT / "tests/data/snapshots/oom.pickle")],
                          capture_output=True, text=True, timeout=60).stdout
    assert "NVIDIA H100" not in text.splitlines()[1]


def test_a_snapshot_without_a_trace_reports_its_state_not_a_peak():
    path = str(ROOT / "tests/data/snapshots/segments_only.pickle")
    text = subprocess.run([BIN, "explain", path], capture_output=True, text=True, timeout=60).stdout
    assert "when the snapshot was taken (it has no trace: no peak is known)" in text
    assert "peak allocated" not in text and "When the peak happens" not in text
    j = json.loads(subprocess.run([BIN, "explain", path, "--json"], capture_output=True, text=True,
                                  timeout=60).stdout)
    assert j["state_only"] is True and j["ranks"][0]["state_only"] is True
    traced = json.loads(subprocess.run([BIN, "explain", str(ROOT / "tests/data/snapshots/newest.pickle"),
                                        "--json"], capture_output=True, text=True, timeout=60).stdout)
    assert traced["state_only"] is False


def test_stacks_all_snapshot_names_python_ops_and_sites():
    """Issue 40: with stacks="all" every stack starts with the unwinder's own frames
    (torch::unwind::unwind, CapturedTraceback::gather) and the allocator's; the op and the
    site are the Python frames behind them, or the autograd node on the engine's thread
    (tests/snapshots/make_stacks_all.py)."""
    r = run_json("explain", DATA / "stacks_all.pickle", "--top", "40")
    text = json.dumps(r)
    for runtime in ("unwind", "CapturedTraceback", "CUDACachingAllocator", "_empty_generic",
                    "at::_ops::"):
        assert runtime not in text, runtime
    ops = {a["op"] for a in r["top_allocations"]}
    assert {"_apply", "_init_group"} <= ops, ops
    assert any("AccumulateGrad" in op for op in ops), ops
    sites = {s["site"] for s in r["snapshot"]["top_sites"]}
    assert "train.py:60 train" in sites and "train.py:20 load_model" in sites, sites
    # The same run recorded with Python stacks only measures the same.
    plain = run_json("explain", DATA / "train_p4.pickle")
    assert r["breakdown_at_peak"] == plain["breakdown_at_peak"]


def test_a_snapshot_without_an_oom_gets_no_verdict_unless_a_gpu_is_named():
    """Issue 40: a snapshot records its device's memory only at an OOM, so a verdict against
    the default H100 would judge a run that may have been on any GPU."""
    p, _ = run("explain", DATA / "stacks_all.pickle")
    assert p.returncode == 0, p.stderr
    assert "FITS" not in p.stdout and "NVIDIA H100" not in p.stdout
    assert "MEASURED, no fit verdict" in p.stdout
    assert run_json("explain", DATA / "stacks_all.pickle")["fits"] is None
    named = run_json("explain", DATA / "stacks_all.pickle", "--gpu", "a100-80g")
    assert named["fits"] is True and named["gpu"]["name"] == "a100-80g"
    p, _ = run("explain", DATA / "stacks_all.pickle", "--gpu", "a100-80g")
    assert "FITS on NVIDIA A100" in p.stdout
    # An OOM snapshot is judged against its own device, named or not.
    assert run_json("explain", DATA / "oom.pickle")["fits"] is False


def test_identical_steps_are_one_row_of_the_phase_table():
    """Issue 40: 12 recorded steps whose steps 4-11 are byte-identical read as one row per
    phase, not 8; the JSON keeps every step."""
    p, _ = run("explain", DATA / "stacks_all.pickle")
    table = p.stdout.split("Peak per step and phase")[1].split("\n\n")[0]
    rows = [line.split() for line in table.splitlines()[2:]]
    assert [row[:2] for row in rows if row[0] == "4-11"] == [
        ["4-11", "forward"], ["4-11", "backward"], ["4-11", "optimizer"]]
    assert not any(row[0] in {str(s) for s in range(4, 12)} for row in rows)
    assert len(run_json("explain", DATA / "stacks_all.pickle")["phases"]) == 1 + 12 * 3
