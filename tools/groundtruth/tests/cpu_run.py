"""Runs one configuration through the worker's whole measuring path on the CPU, with the
real torch / transformers / PEFT (and DeepSpeed / accelerate for the data-parallel knobs).
Shared by test_worker_cpu.py and dist_cpu_child.py; needs those libraries installed."""

import json
import tempfile
import time
from pathlib import Path

from gtlib import knobs, models, plan, schema, worker

DATA_MODELS = (Path(__file__).resolve().parent / "data" / "models",)


class ZeroProbe:
    """CudaProbe's interface with zero readings (CPU has no caching-allocator counters)."""

    def sync(self):
        pass

    def reset_peak(self):
        pass

    def allocated(self):
        return 0

    reserved = peak_allocated = peak_reserved = device_used = device_total = allocated

    def stats(self):
        return {}

    def is_oom(self, exc):
        return False


def run_on_cpu(torch, model_dirs=DATA_MODELS, **raw):
    """The record and plan of `raw` (knobs over seq 16, batch 2, 2 steps), measured on the CPU."""
    k = knobs.normalize_knobs({"seq": 16, "batch": 2, "steps": 2, **raw})
    resolved = models.resolve_model(k["model"], model_dirs)
    p = plan.make_plan(k, resolved.config)
    job = {"config": {"id": "x", "name": "x", "knobs": k, "label": None}, "plan": p,
           "model": {"config": resolved.config, "alias": resolved.alias, "hub_id": None,
                     "source": resolved.source}}
    env = {"python_version": "3", "packages": {}, "gpu_present": True}
    record = schema.new_record(knobs.config_id(k), knobs.config_name(k), k, None, env, "test",
                               {"version": "test"})
    record["plan"] = p
    with tempfile.TemporaryDirectory() as scratch:
        if p["build"]["method"] == "from_pretrained_4bit":
            # The QLoRA helper's job: random weights saved for from_pretrained.
            job_path = Path(scratch) / "job.json"
            job_path.write_text(json.dumps(job), encoding="utf-8")
            worker.prepare_4bit_source(job_path, scratch, device="cpu")
        worker._measure_on_gpu(torch, job, p, record, scratch, time.perf_counter,
                               device="cpu", probe=ZeroProbe())
    return record, p
