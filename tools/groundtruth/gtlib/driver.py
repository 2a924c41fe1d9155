"""Runs a list of configurations, each in a fresh worker process, into a JSONL file.

The driver never initialises CUDA itself (it would hold a context on the GPU
and distort the workers' device readings). For each configuration it:
resolves the model, computes the plan, checks that the plan's libraries are
importable, writes a job file, starts `python -m gtlib.worker` in its own
process group with PYTORCH_CUDA_ALLOC_CONF set from the knob (and the
allocator-changing variables removed), waits at most the per-config timeout,
validates the record and appends it to the output (one line, flushed and
fsync'ed, so an interrupted run leaves whole lines).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import env as envmod
from . import models as M
from . import plan as P
from . import schema

HARNESS_VERSION = "1.0"
TOOL_DIR = Path(__file__).resolve().parents[1]
STDERR_TAIL_CHARS = 3000
MIN_LAUNCH_SECONDS = 20  # with less time left in the budget, no new config is started

# Variables removed from the worker's environment: each changes what the allocator does.
SCRUBBED_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


@dataclass
class Options:
    out_path: Path
    timeout_s: float = 600.0
    time_budget_s: float | None = None
    snapshot_dir: Path | None = None
    snapshot_patterns: tuple = ()
    snapshot_max_entries: int = 20000
    snapshot_from_step: int | None = None  # None: step 2 only; 1: steps 1 and 2; 0: setup too
    resume: bool = False
    model_dirs: tuple = M.DEFAULT_MODEL_DIRS
    python: str = sys.executable
    verbose: bool = False
    command: str = ""
    env: dict | None = None             # environment recorded for records made by the driver
    worker_argv: list | None = None     # seam for tests: replaces [python, -m, gtlib.worker]
    overlap: bool = False               # start the next worker (gated) during the current one
    log: object = sys.stderr


@dataclass
class RunSummary:
    counts: dict = field(default_factory=lambda: {s: 0 for s in schema.STATUSES})
    already_done: int = 0
    not_run: int = 0
    elapsed_s: float = 0.0


def git_commit():
    try:
        done = subprocess.run(["git", "-C", str(TOOL_DIR), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def missing_modules(requires, importable=None):
    """Import names from the plan that cannot be found (checked without importing).

    importable: {name: bool} as the worker interpreter reported it (env
    "importable"); names it does not list are looked up in this interpreter.
    """
    missing = []
    for name in requires:
        if importable is not None and name in importable:
            if not importable[name]:
                missing.append(name)
            continue
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing


def worker_environment(alloc_conf, base=None):
    env = dict(os.environ if base is None else base)
    for key in SCRUBBED_ENV:
        env.pop(key, None)
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.update(OFFLINE_ENV)
    env["PYTHONPATH"] = os.pathsep.join([str(TOOL_DIR)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def read_done_ids(out_path):
    """Ids already recorded in an output file (for --resume); unreadable lines are ignored."""
    done = set()
    try:
        with open(out_path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("id"), str):
                    done.add(rec["id"])
    except FileNotFoundError:
        pass
    return done


def _wants_snapshot(config, opts):
    if opts.snapshot_dir is None:
        return False
    if not opts.snapshot_patterns:
        return True
    from .grid import select
    return bool(select([config], list(opts.snapshot_patterns)))


def _tail(path, limit=STDERR_TAIL_CHARS):
    try:
        data = Path(path).read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def measure_config(config, opts, harness, remaining_s=None):
    """Produces the (validated) record of one configuration."""
    job = launch_config(config, opts, harness, gated=False)
    return job if isinstance(job, dict) else job.run(opts, remaining_s)


def launch_config(config, opts, harness, gated):
    """The record of a configuration that needs no worker (skipped), or its started WorkerJob.

    gated: the worker imports its libraries, then waits for WorkerJob.run's "go"
    before it touches the GPU (see Options.overlap).
    """
    env = opts.env or envmod.capture_environment()
    record = schema.new_record(config.id, config.name, config.knobs, config.label, env,
                               opts.command, dict(harness))
    try:
        resolved = M.resolve_model(config.knobs["model"], opts.model_dirs)
    except M.ModelError as e:
        return schema.mark_skipped(record, str(e))
    try:
        plan = P.make_plan(config.knobs, resolved.config)
    except P.PlanSkip as e:
        return schema.mark_skipped(record, str(e))
    record["plan"] = plan
    if opts.worker_argv is None:
        missing = missing_modules(plan["requires"], env.get("importable"))
        if missing:
            return schema.mark_skipped(
                record, f"needs {', '.join(missing)}, which cannot be imported here")
    job = WorkerJob(config, record, resolved, plan, opts, harness, gated)
    job.start(opts)
    return job


class WorkerJob:
    """One configuration's worker process and its job directory (removed by finish)."""

    def __init__(self, config, record, resolved, plan, opts, harness, gated):
        self.record, self.gated = record, gated
        self.proc = None
        self._tmp = tempfile.TemporaryDirectory(prefix="vramscope-gt-job-")
        tmp = Path(self._tmp.name)
        self.job_path, self.result_path = tmp / "job.json", tmp / "result.json"
        self.stderr_path = tmp / "stderr.txt"
        job = {
            "config": {"id": config.id, "name": config.name, "knobs": config.knobs,
                       "label": config.label},
            "plan": plan,
            "model": {"name": resolved.name, "alias": resolved.alias, "hub_id": resolved.hub_id,
                      "source": resolved.source, "config": resolved.config},
            "snapshot": None,
            "command": opts.command,
            "harness": harness,
            "env": record["env"],
            "prepare_timeout_s": opts.timeout_s,
            "scratch_dir": str(tmp / "scratch"),
            "wait_for_go": gated,
        }
        (tmp / "scratch").mkdir()
        if _wants_snapshot(config, opts):
            opts.snapshot_dir.mkdir(parents=True, exist_ok=True)
            job["snapshot"] = {"path": str((opts.snapshot_dir / f"{config.id}.pickle").resolve()),
                               "max_entries": opts.snapshot_max_entries,
                               "from_step": opts.snapshot_from_step}
        self.job_path.write_text(json.dumps(job), encoding="utf-8")

    def start(self, opts):
        argv = (opts.worker_argv or [opts.python, "-m", "gtlib.worker"]) + [
            "--job", str(self.job_path), "--result", str(self.result_path)]
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                argv, cwd=str(TOOL_DIR), env=worker_environment(self.record["knobs"]["alloc_conf"]),
                stdin=subprocess.PIPE if self.gated else subprocess.DEVNULL, stdout=err,
                stderr=subprocess.STDOUT, start_new_session=True)

    def run(self, opts, remaining_s=None):
        """Lets the worker measure (the timeout counts from here); returns the record."""
        timeout = opts.timeout_s if remaining_s is None else max(1.0, min(opts.timeout_s,
                                                                          remaining_s))
        try:
            if self.gated:
                with contextlib.suppress(OSError):  # a worker that already died: reported below
                    self.proc.stdin.write(b"go\n")
                    self.proc.stdin.close()
            rc, timed_out = _wait_worker(self.proc, timeout)
            return self._finish(rc, timed_out, timeout)
        finally:
            self._tmp.cleanup()

    def withdraw(self):
        """Ends a started worker that will not run (time budget spent)."""
        _kill_group(self.proc)
        self._tmp.cleanup()

    def _finish(self, rc, timed_out, timeout):
        record = self.record
        tail = _tail(self.stderr_path)
        record["harness"].update(worker_exit_code=rc, stderr_tail=tail)
        if timed_out:
            return schema.mark_error(record, "timeout",
                                     f"no result within {timeout:.0f} s; the worker was killed")
        if not self.result_path.exists():
            return schema.mark_error(record, "crash",
                                     f"the worker exited with code {rc} without a result")
        try:
            worker_record = json.loads(self.result_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            return schema.mark_error(record, "invalid-result", f"unreadable worker result: {e}")
        if isinstance(worker_record, dict):
            worker_record.setdefault("harness", {}).update(worker_exit_code=rc, stderr_tail=tail)
        problems = schema.validate_result(worker_record)
        if problems:
            # The raw record is kept for diagnosis; the error record itself stays valid.
            record["harness"]["invalid_worker_record"] = worker_record
            return schema.mark_error(record, "invalid-result", "the worker's record failed "
                                     "validation: " + "; ".join(problems[:20]))
        return worker_record


def _wait_worker(proc, timeout):
    """Waits for the worker (its own process group); kills the whole group on timeout."""
    try:
        return proc.wait(timeout=timeout), False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return proc.returncode, True
    except BaseException:
        _kill_group(proc)
        raise


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def run_configs(configs, opts, clock=time.monotonic):
    """Measures `configs` in order into opts.out_path; returns a RunSummary.

    With opts.overlap the next configuration's worker is started (gated) while
    the current one measures, so Python and library imports overlap GPU work;
    only one worker at a time ever touches the GPU.
    """
    start = clock()
    summary = RunSummary()
    harness = {"version": HARNESS_VERSION, "git_commit": git_commit(),
               "overlapped_imports": bool(opts.overlap)}
    done = read_done_ids(opts.out_path) if opts.resume else set()
    opts.out_path.parent.mkdir(parents=True, exist_ok=True)
    mode = "a" if opts.resume else "w"
    todo = [c for c in configs if c.id not in done]
    summary.already_done = len(configs) - len(todo)
    launched = None  # the next configuration's started worker (overlap), or its record
    try:
        with open(opts.out_path, mode, encoding="utf-8") as out:
            for index, config in enumerate(todo, start=1):
                remaining = None
                if opts.time_budget_s is not None:
                    remaining = opts.time_budget_s - (clock() - start)
                    if remaining < MIN_LAUNCH_SECONDS:
                        summary.not_run = len(todo) - index + 1
                        print(f"time budget spent: {summary.not_run} configuration(s) not run "
                              "(run again with --resume to continue)", file=opts.log)
                        break
                t0 = clock()
                current = launched or launch_config(config, opts, harness, opts.overlap)
                launched = None
                if opts.overlap and index < len(todo):
                    launched = launch_config(todo[index], opts, harness, True)
                record = current if isinstance(current, dict) else current.run(opts, remaining)
                _append(out, record)
                summary.counts[record["status"]] += 1
                print(progress_line(index, len(todo), record, clock() - t0), file=opts.log,
                      flush=True)
    finally:
        if isinstance(launched, WorkerJob):
            launched.withdraw()
    summary.elapsed_s = clock() - start
    return summary


def _append(out, record):
    """One line, flushed and fsync'ed: an interrupted run leaves whole lines."""
    out.write(json.dumps(record, sort_keys=False) + "\n")
    out.flush()
    os.fsync(out.fileno())


def progress_line(index, total, record, seconds):
    gib = 1 << 30
    text = f"[{index}/{total}] {record['status']:<7} {seconds:6.1f}s  {record['id']}"
    mem = record.get("memory") or {}
    if mem.get("peak_allocated_bytes") is not None:
        text += (f"  alloc {mem['peak_allocated_bytes'] / gib:.2f} GiB"
                 f"  reserved {mem['peak_reserved_bytes'] / gib:.2f} GiB")
    if record["status"] != "ok" and record.get("reason"):
        text += "  (" + record["reason"].splitlines()[0][:120] + ")"
    return text + "\n    " + record["name"]


def preflight(python, timeout_s=180):
    """Environment seen by a worker process (GPU included), or None if the probe failed."""
    with tempfile.TemporaryDirectory(prefix="vramscope-gt-probe-") as tmp:
        path = Path(tmp) / "env.json"
        try:
            subprocess.run([python, "-m", "gtlib.worker", "--probe", str(path)], cwd=str(TOOL_DIR),
                           env=worker_environment(""), capture_output=True, timeout=timeout_s,
                           check=False)
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
            return None
