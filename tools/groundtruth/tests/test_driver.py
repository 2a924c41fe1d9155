"""The driver with a fake worker: timeouts, crashes, invalid records, resume, budget, CLI."""

import io
import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gtlib import driver, grid, schema

TOOL_DIR = Path(__file__).resolve().parents[1]
MODELS = Path(__file__).resolve().parent / "data" / "models"

# Behaviour chosen by the seq knob: 111 sleeps, 222 dies, 333 writes garbage,
# 444 writes a record that fails validation; anything else writes a valid ok record.
FAKE_WORKER = textwrap.dedent('''
    import json, os, sys, time
    from gtlib import schema
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    job = json.load(open(args["--job"]))
    cfg = job["config"]
    seq = cfg["knobs"]["seq"]
    started = time.time()
    if job.get("wait_for_go") and sys.stdin.readline().strip() != "go":
        sys.exit(0)
    went = time.time()
    if seq == 555:
        time.sleep(0.5)
    if seq == 111:
        time.sleep(60)
    if seq == 222:
        sys.exit(3)
    if seq == 333:
        open(args["--result"], "w").write("{not json")
        sys.exit(0)
    env = dict(job["env"], gpu_present=True)
    rec = schema.new_record(cfg["id"], cfg["name"], cfg["knobs"], cfg["label"], env,
                            job["command"], job["harness"])
    rec["plan"] = job["plan"]
    rec["harness"]["seen_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    rec["harness"]["seen_offline"] = os.environ.get("HF_HUB_OFFLINE")
    rec["harness"]["times"] = [started, went, time.time()]
    point = {"allocated_bytes": 1, "reserved_bytes": 2, "device_used_bytes": 3}
    ph = {"step": 1, "micro_batch": 0, "phase": "forward", "completed": True,
          "begin_allocated_bytes": 1, "begin_reserved_bytes": 2, "peak_allocated_bytes": 5,
          "peak_reserved_bytes": 6, "end_allocated_bytes": 1, "end_reserved_bytes": 2,
          "end_device_used_bytes": 9, "duration_ms": 1.0}
    rec.update(status="ok", phases=[ph], model={
        "alias": "x", "hub_id": None, "source": "s", "model_type": "llama", "architecture": "A",
        "parameters": 1, "trainable_parameters": 1, "parameter_bytes_by_dtype": {},
        "lora_modules": None, "applied": {}})
    rec["memory"] = {"device_total_bytes": 100, "cuda_context_bytes": 10, "before_model": point,
        "setup": dict(point, peak_allocated_bytes=1, peak_reserved_bytes=2),
        "peak_allocated_bytes": 5, "peak_reserved_bytes": 6, "peak_device_used_bytes": 9,
        "num_alloc_retries": 0, "num_ooms": 0, "allocator_stats": {},
        "nvidia_smi_process_bytes": None}
    if seq == 444:
        rec["memory"]["peak_allocated_bytes"] = -5
    json.dump(rec, open(args["--result"], "w"))
''')


@pytest.fixture
def fake_worker(tmp_path):
    path = tmp_path / "fake_worker.py"
    path.write_text(FAKE_WORKER)
    return [sys.executable, str(path)]


def configs(text):
    return grid.parse_grid(text)


def options(tmp_path, fake_worker, **kw):
    env = {"python_version": "3", "packages": {}, "gpu_present": True}
    return driver.Options(out_path=tmp_path / "out.jsonl", model_dirs=(MODELS,),
                          worker_argv=fake_worker, env=env, command="test", log=io.StringIO(),
                          **kw)


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_statuses_from_worker_outcomes(tmp_path, fake_worker):
    cs = configs('''
        [defaults]
        model = "tiny-llama"
        [[sweep]]
        sweep = { seq = [64, 111, 222, 333, 444] }
        [[sweep]]
        model = "tiny-gpt2"
        seq = 1000          # beyond gpt2's learned positions: skipped by the plan
        [[sweep]]
        model = "no-such-model"
        seq = 8
    ''')
    opts = options(tmp_path, fake_worker, timeout_s=5)
    summary = driver.run_configs(cs, opts)
    recs = read(opts.out_path)
    assert [r["status"] for r in recs] == ["ok", "error", "error", "error", "error",
                                           "skipped", "skipped"]
    assert [r["error_kind"] for r in recs[1:5]] == ["timeout", "crash", "invalid-result",
                                                   "invalid-result"]
    assert "failed validation" in recs[4]["reason"]
    assert "learned positions" in recs[5]["reason"]
    assert "no catalog entry" in recs[6]["reason"]
    for rec in recs:
        assert schema.validate_result(rec) == [], rec["id"]
    assert summary.counts == {"ok": 1, "oom": 0, "skipped": 2, "error": 4}
    assert recs[0]["harness"]["seen_offline"] == "1"
    assert recs[0]["harness"]["worker_exit_code"] == 0


def test_alloc_conf_reaches_the_worker_and_user_setting_is_overridden(tmp_path, fake_worker,
                                                                      monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
    cs = configs('''
        [[sweep]]
        model = "tiny-llama"
        seq = 64
        sweep = { alloc_conf = ["", "expandable_segments:True"] }
    ''')
    opts = options(tmp_path, fake_worker)
    driver.run_configs(cs, opts)
    seen = [r["harness"]["seen_alloc_conf"] for r in read(opts.out_path)]
    assert seen == [None, "expandable_segments:True"]
    env = driver.worker_environment("")
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in env
    assert str(TOOL_DIR) in env["PYTHONPATH"].split(":")


def test_resume_skips_recorded_ids(tmp_path, fake_worker):
    cs = configs('[[sweep]]\nmodel = "tiny-llama"\nsweep = { seq = [8, 16, 32] }\n')
    opts = options(tmp_path, fake_worker)
    driver.run_configs(cs[:2], opts)
    opts.resume = True
    summary = driver.run_configs(cs, opts)
    assert summary.already_done == 2
    assert [r["knobs"]["seq"] for r in read(opts.out_path)] == [8, 16, 32]


def test_time_budget_stops_launching(tmp_path, fake_worker):
    cs = configs('[[sweep]]\nmodel = "tiny-llama"\nsweep = { seq = [8, 16, 32] }\n')
    # Clock reads: run start, then per config: budget check, start, end. The second
    # budget check sees 1000 s spent of 100.
    ticks = itertools.chain([0, 0, 0, 0], itertools.repeat(1000))
    opts = options(tmp_path, fake_worker, time_budget_s=100)
    summary = driver.run_configs(cs, opts, clock=lambda: next(ticks))
    assert summary.not_run == 2
    assert len(read(opts.out_path)) == 1
    assert "time budget spent" in opts.log.getvalue()


def test_missing_libraries_skip_without_starting_a_worker(tmp_path):
    cs = configs('[[sweep]]\nmodel = "tiny-llama"\nseq = 8\nfinetune = "qlora"\n')
    opts = options(tmp_path, None)
    opts.worker_argv = None
    opts.python = "/nonexistent/python"  # would fail if a worker were started
    if not driver.missing_modules(["bitsandbytes"]):
        pytest.skip("bitsandbytes is importable here")
    rec = driver.measure_config(cs[0], opts, {"version": "t"})
    assert rec["status"] == "skipped" and "bitsandbytes" in rec["reason"]


def test_snapshot_selection(tmp_path):
    cs = configs('[[sweep]]\nmodel = "tiny-llama"\nsweep = { seq = [8, 16] }\n')
    opts = driver.Options(out_path=tmp_path / "o", snapshot_dir=tmp_path / "s",
                          snapshot_patterns=("seq=16 ",))
    assert [driver._wants_snapshot(c, opts) for c in cs] == [False, True]
    opts.snapshot_patterns = ()
    assert all(driver._wants_snapshot(c, opts) for c in cs)
    opts.snapshot_dir = None
    assert not any(driver._wants_snapshot(c, opts) for c in cs)


def run_cli(*args):
    return subprocess.run([sys.executable, str(TOOL_DIR / "measure.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_dry_run_prints_plans(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text('[[sweep]]\nmodel = "tiny-llama"\nseq = 64\nsweep = { finetune = ["full", "lora"] }\n'
                 '[[sweep]]\nmodel = "tiny-gpt2"\nseq = 4096\n')
    done = run_cli("--grid", str(g), "--dry-run", "--models-dir", str(MODELS))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("plan: ") == 2
    assert "vramscope estimate tiny-llama --batch 1 --seq 64" in done.stdout
    assert "skipped: seq 4096 exceeds gpt2" in done.stdout


def test_cli_bad_grid_exits_2(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text("[[sweep]]\nmodel = 'a'\nbatch = 'many'\n")
    done = run_cli("--grid", str(g), "--out", str(tmp_path / "o.jsonl"))
    assert done.returncode == 2
    assert "knob 'batch' must be an integer" in done.stderr
    assert run_cli("--out", "x").returncode == 2
    assert run_cli("--grid", str(g) + ".missing", "--list").returncode == 2


def test_cli_without_gpu_exits_2_with_a_clear_message(tmp_path):
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    g = tmp_path / "g.toml"
    g.write_text('[[sweep]]\nmodel = "tiny-llama"\nseq = 8\n')
    done = run_cli("--grid", str(g), "--out", str(tmp_path / "o.jsonl"),
                   "--models-dir", str(MODELS))
    assert done.returncode == 2
    assert "no CUDA GPU" in done.stderr


def test_cli_summarize(tmp_path, fake_worker):
    cs = configs('[[sweep]]\nmodel = "tiny-llama"\nsweep = { seq = [8, 222] }\n')
    opts = options(tmp_path, fake_worker)
    driver.run_configs(cs, opts)
    with open(opts.out_path, "a") as f:
        f.write("{broken\n")
    done = run_cli("--summarize", str(opts.out_path))
    assert done.returncode == 0
    assert "2 record(s): 1 ok, 0 oom, 0 skipped, 1 error" in done.stdout
    assert "not JSON" in done.stdout


def test_missing_modules_prefers_the_worker_interpreters_answer():
    assert driver.missing_modules(["json", "peft"], {"peft": False, "json": True}) == ["peft"]
    assert driver.missing_modules(["json"], {}) == []
    assert driver.missing_modules(["no_such_module_vramscope"]) == ["no_such_module_vramscope"]


def test_overlap_starts_the_next_worker_early_but_lets_it_measure_only_after(tmp_path,
                                                                             fake_worker):
    cs = configs('[[sweep]]\nmodel = "tiny-llama"\nsweep = { seq = [555, 556, 557] }')
    opts = options(tmp_path, fake_worker, overlap=True)
    summary = driver.run_configs(cs, opts)
    assert summary.counts["ok"] == 3
    recs = read(opts.out_path)
    times = [r["harness"]["times"] for r in recs]
    assert all(r["harness"]["overlapped_imports"] for r in recs)
    # the second worker was started while the first measured (it sleeps 0.5 s) ...
    assert times[1][0] < times[0][2]
    # ... and was let go only after the first had finished
    for before, after in zip(times, times[1:]):
        assert after[1] >= before[2]


def test_overlap_withdraws_the_started_worker_when_the_budget_is_spent(tmp_path, fake_worker):
    cs = configs('[[sweep]]\nmodel = "tiny-llama"\nsweep = { seq = [555, 556] }')
    ticks = itertools.count(0, 15)
    opts = options(tmp_path, fake_worker, overlap=True, time_budget_s=40)
    summary = driver.run_configs(cs, opts, clock=lambda: next(ticks))
    assert summary.counts["ok"] == 1 and summary.not_run == 1
    assert len(read(opts.out_path)) == 1
