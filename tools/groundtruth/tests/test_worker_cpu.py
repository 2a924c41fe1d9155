"""The worker's whole measurement path with the REAL torch, transformers and peft, on CPU.

Run with an interpreter that has them (scripts/test.sh's harness-cpu step uses .venv/tf5; skipped elsewhere):
every knob value the grids use goes through model building, LoRA, checkpointing, the
optimizer, the loss and the phase loop, so an API change in a library fails here, on CPU,
before a GPU session is spent on it. Memory readings are zeros (the probe is a stand-in);
what is checked is that each configuration runs to a complete, schema-valid record.
"""

import json
import tempfile
import time
from pathlib import Path

import pytest

from gtlib import knobs, models, plan, schema, worker

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")


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


def run_on_cpu(model_dirs, **raw):
    k = knobs.normalize_knobs({"seq": 16, "batch": 2, "steps": 2, **raw})
    resolved = models.resolve_model(k["model"], model_dirs)
    p = plan.make_plan(k, resolved.config)
    job = {"config": {"id": "x", "name": "x", "knobs": k, "label": None}, "plan": p,
           "model": {"config": resolved.config, "alias": resolved.alias, "hub_id": None,
                     "source": resolved.source}}
    env = {"python_version": "3", "packages": {}, "gpu_present": True}
    record = schema.new_record(knobs.config_id(k), "x", k, None, env, "test", {"version": "test"})
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


CASES = [
    dict(model="tiny-llama", precision="bf16-mixed", optimizer="adamw"),
    dict(model="tiny-llama", precision="bf16", optimizer="adamw-fused", attn="eager",
         grad_ckpt="full"),
    dict(model="tiny-llama", precision="fp32", optimizer="adamw-foreach", grad_ckpt="reentrant"),
    dict(model="tiny-llama", precision="bf16", optimizer="sgd", loss="chunked", grad_ckpt="full"),
    dict(model="tiny-llama", precision="fp16-mixed", optimizer="adamw-forloop"),
    dict(model="tiny-llama", precision="bf16-mixed", optimizer="none", grad_accum=2),
    dict(model="tiny-llama", precision="bf16-mixed", optimizer="sgd-momentum"),
    dict(model="tiny-llama", precision="bf16-mixed", optimizer="adafactor"),
    dict(model="tiny-llama", finetune="lora", lora_targets="all-linear", precision="bf16",
         optimizer="adamw", grad_ckpt="reentrant"),
    dict(model="tiny-llama", finetune="lora", lora_targets="q,v", precision="bf16-mixed",
         optimizer="adamw", lora_rank=8),
    dict(model="tiny-gpt2", finetune="lora", lora_targets="q,v", precision="bf16-mixed",
         optimizer="adamw", attn="eager"),
    dict(model="tiny-gpt2", precision="fp32", optimizer="sgd", attn="eager", grad_ckpt="full"),
    dict(model="tiny-gemma2", precision="bf16", optimizer="adamw-fused", attn="eager",
         loss="chunked"),
    dict(model="tiny-phi3", finetune="lora", lora_targets="q,k,v,o,gate,up,down",
         precision="bf16", optimizer="adamw"),
    dict(model="tiny-bert", precision="bf16-mixed", optimizer="adamw"),
]


# bitsandbytes paths (its CPU backend; requirements/reference-tf5.in pins the release the GPU
# measurements carried). fp16 compute is left out: bitsandbytes' CPU 4-bit matmul in fp16 takes
# minutes.
BNB_CASES = [
    dict(model="tiny-llama", finetune="qlora", lora_targets="all-linear", precision="bf16-mixed",
         optimizer="adamw", grad_ckpt="full"),
    dict(model="tiny-phi3", finetune="qlora", lora_targets="all-linear", precision="bf16-mixed",
         optimizer="paged-adamw-8bit", grad_ckpt="full"),
    dict(model="tiny-gpt2", finetune="qlora", lora_targets="all-linear", precision="bf16-mixed",
         optimizer="adamw"),
    dict(model="tiny-llama", precision="bf16-mixed", optimizer="adamw-8bit"),
]


@pytest.mark.parametrize("raw", CASES, ids=lambda raw: " ".join(f"{k}={v}" for k, v in raw.items()))
def test_configuration_runs_with_the_real_libraries(model_dirs, raw):
    check_runs(model_dirs, raw)


@pytest.mark.parametrize("raw", BNB_CASES,
                         ids=lambda raw: " ".join(f"{k}={v}" for k, v in raw.items()))
def test_bitsandbytes_configuration_runs_with_the_real_libraries(model_dirs, raw):
    pytest.importorskip("bitsandbytes")
    record = check_runs(model_dirs, raw)
    if raw.get("finetune") == "qlora":
        assert "uint8" in record["model"]["parameter_bytes_by_dtype"]  # the packed 4-bit weights


def check_runs(model_dirs, raw):
    record, p = run_on_cpu(model_dirs, **raw)
    assert record["status"] == "ok", record.get("reason")
    assert schema.validate_result(record) == []
    phases = {(ph["step"], ph["phase"]) for ph in record["phases"]}
    optimizer_phases = 0 if p["optimizer"] is None else p["steps"]
    assert len([ph for ph in phases if ph[1] == "optimizer"]) == optimizer_phases
    assert len([ph for ph in phases if ph[1] == "forward"]) == p["steps"]
    assert record["model"]["parameters"] > 0
    if raw.get("finetune") in ("lora", "qlora"):
        assert 0 < record["model"]["trainable_parameters"] < record["model"]["parameters"]
        assert record["model"]["lora_modules"] > 0
    return record


def test_wait_for_go_reads_one_line():
    import io
    assert worker.wait_for_go(io.StringIO("go\n"))
    assert not worker.wait_for_go(io.StringIO(""))
    assert not worker.wait_for_go(io.StringIO("stop\n"))
