"""What a setup that does not fit needs (issue 18): the whole run, not where it failed.

A run that runs out of memory on the chosen GPU is replayed without the GPU's limit;
`needed_bytes`, `headroom_bytes`, the verdict line, `--explain`'s deltas, sweep and plan
use that full requirement. Checked against an estimate on a GPU large enough to hold it.
"""
import json
import os
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
GiB = 1 << 30

# Llama-3-8B, full fine-tune, fp32 master weights: about 168 GiB in all, so it does not
# fit an 80 GiB H100 and does fit a 192 GiB MI300X.
SETUP = ["estimate", "llama-3-8b", "--seq", "2048", "--precision", "bf16-mixed", "--optimizer", "adamw"]
# With fused AdamW at 512 tokens about 130 GiB: too much for an H100, enough for an H200
# (the same kernels, so the same event stream).
HOPPER_SETUP = ["estimate", "llama-3-8b", "--seq", "512", "--precision", "bf16-mixed", "--optimizer", "adamw-fused"]


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return p.stdout


def run_json(*args):
    return json.loads(run(*args, "--json"))


def test_needed_bytes_is_the_whole_run_on_a_gpu_too_small_and_on_one_large_enough():
    small = run_json(*HOPPER_SETUP, "--gpu", "h100-80g")
    large = run_json(*HOPPER_SETUP, "--gpu", "h200")
    assert not small["fits"] and small["oom"] is not None
    assert large["fits"] and large["oom"] is None and large["full_requirement"] is None
    full = small["full_requirement"]
    # The replay without a limit is the run on the larger GPU, byte for byte.
    assert full["peak_allocated_bytes"] == large["peak_allocated_bytes"]
    assert full["peak_reserved_bytes"] == large["peak_reserved_bytes"]
    assert (full["step"], full["phase"]) == (large["peak"]["step"], large["peak"]["phase"])
    assert small["needed_bytes"] == full["device_total_bytes"]
    # The device figure adds each GPU's own CUDA context (the H100's is measured).
    context = {g["name"]: g["cuda_context_bytes"] for g in json.loads(run("gpus", "--json"))}
    assert (full["device_total_bytes"] - context["h100-80g"]
            == large["device_total_bytes"] - context["h200"])
    assert small["needed_bytes"] > 100 * GiB > small["device_total_bytes"]
    assert small["headroom_bytes"] == small["gpu"]["usable_bytes"] - small["needed_bytes"] < 0
    assert large["headroom_bytes"] == large["gpu"]["usable_bytes"] - large["needed_bytes"] > 0


def test_a_setup_needing_150_gib_says_so_on_80_and_on_192_gib():
    small = run_json(*SETUP, "--gpu", "h100-80g")
    large = run_json(*SETUP, "--gpu", "mi300x")
    assert not small["fits"] and large["fits"]
    assert small["needed_bytes"] > 150 * GiB and large["needed_bytes"] > 150 * GiB
    # The MI300X's kernels differ a little (its context too): within 1%.
    assert abs(small["needed_bytes"] - large["needed_bytes"]) < 0.01 * large["needed_bytes"]


def test_verdict_states_the_full_requirement_and_the_shortfall():
    data = run_json(*SETUP)
    text = run(*SETUP)
    needed = f"{data['needed_bytes'] / GiB:.2f} GiB"
    short = f"{-data['headroom_bytes'] / GiB:.2f} GiB short"
    verdict = next(line for line in text.splitlines() if line.startswith("DOES NOT FIT"))
    assert f"needs {needed}" in verdict and short in verdict and "out of memory in step" in verdict
    assert "What the run needs (the whole run replayed without the GPU's limit)" in text


def signed_gib(after, before):
    d = after - before
    return f"{'+' if d >= 0 else '-'}{abs(d) / GiB:.2f} GiB"


def test_explain_deltas_on_a_setup_that_does_not_fit_are_differences_of_full_requirements():
    base = run_json(*SETUP)
    changed = run_json(*[a if a != "adamw" else "adamw-8bit" for a in SETUP])
    assert not base["fits"]
    lines = run_json(*SETUP, "--explain")["explanation"]
    line = next(l for l in lines if l.strip().startswith("8-bit AdamW"))
    m = re.search(r": (\S+ GiB) peak allocated, (\S+ GiB) on the device", line)
    assert m, line
    full_alloc = lambda r: (r["full_requirement"] or {}).get("peak_allocated_bytes", r["peak_allocated_bytes"])
    assert m.group(1) == signed_gib(full_alloc(changed), full_alloc(base))
    assert m.group(2) == signed_gib(changed["needed_bytes"], base["needed_bytes"])


def test_sweep_points_past_the_gpu_carry_their_whole_requirement():
    out = run_json("sweep", "llama-3-8b", "--seq", "2048", "--batch", "1,2", "--precision", "bf16-mixed",
                   "--optimizer", "adamw")
    assert [p["batch"] for p in out["points"]] == [1, 2]
    for point in out["points"]:
        est = run_json(*SETUP, "--batch", str(point["batch"]))
        assert point["oom"] and not point["fits"]
        assert point["needed_bytes"] == est["needed_bytes"]
        assert point["peak_allocated_bytes"] == est["full_requirement"]["peak_allocated_bytes"]
        assert point["device_total_bytes"] == est["full_requirement"]["device_total_bytes"]
    # The curve goes on past the GPU: twice the batch needs more.
    assert out["points"][1]["needed_bytes"] > out["points"][0]["needed_bytes"]


def test_a_70b_full_fine_tune_shows_one_needed_figure_on_every_surface(tmp_path):
    """Issue 40's must-show: text, JSON, the HTML page, and sweep (text, JSON, HTML) give the
    same whole-run requirement for a setup far over the GPU, and sweep's footnote says what
    its numbers are (it once said they stopped at the OOM while showing the whole run)."""
    args = ["llama-3-70b", "--finetune", "full", "--seq", "2048"]
    data = run_json("estimate", *args)
    needed = f"{data['needed_bytes'] / GiB:.2f} GiB"
    assert not data["fits"] and data["needed_bytes"] > 400 * GiB
    assert data["needed_bytes"] == data["full_requirement"]["device_total_bytes"]
    assert f"needs {needed}" in run("estimate", *args)
    page = tmp_path / "estimate.html"
    run("estimate", *args, "--html", str(page))
    assert f"needs {needed}" in page.read_text()
    sweep_args = ["sweep", *args[:-1], "2048,4096"]
    point = run_json(*sweep_args)["points"][0]
    assert point["needed_bytes"] == point["device_total_bytes"] == data["needed_bytes"]
    text = run(*sweep_args, "--html", str(tmp_path / "sweep.html"))
    row = next(line for line in text.splitlines() if line.split()[:1] == ["2048"])
    assert needed in row and "simulated OOM" in row
    assert f"--seq 2048 needs {needed}" in text
    assert "shows what the whole run needs" in text and "not what the whole step" not in text
    assert needed in (tmp_path / "sweep.html").read_text()


def test_explain_lists_the_precision_change_both_ways():
    """Issue 40 item 2: --explain's knob changes include the precision (bf16 weights vs fp32
    master weights), each delta the difference of two estimates."""
    lora = ["llama-3-8b", "--finetune", "lora", "--seq", "2048"]
    base = run_json("estimate", *lora)
    lines = run_json("estimate", *lora, "--explain")["explanation"]
    line = next(l for l in lines if "(--precision bf16-mixed)" in l)
    mixed = run_json("estimate", *lora, "--precision", "bf16-mixed")
    assert f"{signed_gib(mixed['needed_bytes'], base['needed_bytes'])} on the device" in line
    assert "kept for backward" in line  # the frozen weights' casts, said for adapters
    lines = run_json(*SETUP, "--explain")["explanation"]
    line = next(l for l in lines if "(--precision bf16)" in l)
    assert "(then it fits)" in line and line.split(": ")[1].startswith("-")
