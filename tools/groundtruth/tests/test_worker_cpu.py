"""The worker's whole measurement path with the REAL torch, transformers and peft, on CPU.

Run with an interpreter that has them (scripts/test.sh's harness-cpu step uses .venv/tf5; skipped elsewhere):
every knob value the grids use goes through model building, LoRA, checkpointing, the
optimizer, the loss and the phase loop, so an API change in a library fails here, on CPU,
before a GPU session is spent on it. Memory readings are zeros (the probe is a stand-in);
what is checked is that each configuration runs to a complete, schema-valid record.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gtlib import schema, worker

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from cpu_run import run_on_cpu as _run_on_cpu  # noqa: E402  (needs torch)

HERE = Path(__file__).resolve().parent


def run_on_cpu(model_dirs, **raw):
    return _run_on_cpu(torch, model_dirs, **raw)


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


# The world-size-1 data-parallel path (gtlib/dist_run.py, grids/dist-ws1.toml) for real on the
# CPU: gloo, DeepSpeed's CPU accelerator, accelerate forced to FSDP (dist_run's docstring).
# Child processes side by side: each DeepSpeed configuration in its own (zero.Init changes
# torch process-wide; deepspeed.comm keeps its first process group), DDP and FSDP together.
DIST_GROUPS = [
    [dict(model="tiny-llama", zero=2, zero_buckets="hf-auto", optimizer="adamw-foreach")],
    [dict(model="tiny-llama", zero=3, no_zero_init=True, finetune="lora", grad_ckpt="full")],
    [dict(model="tiny-llama", zero=3, offload="params")],
    [dict(model="tiny-llama", ddp=True),
     dict(model="tiny-llama", fsdp="full", fsdp_version=1, finetune="lora"),
     dict(model="tiny-llama", fsdp="grad-op", fsdp_version=2),
     dict(model="tiny-llama", fsdp="full", fsdp_version=2, fsdp_wrap="layers", precision="bf16")],
]


@pytest.fixture(scope="module")
def dist_results():
    pytest.importorskip("accelerate")
    pytest.importorskip("deepspeed")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    children = [subprocess.Popen([sys.executable, str(HERE / "dist_cpu_child.py"),
                                  json.dumps(group)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env)
                for group in DIST_GROUPS]
    results = []
    for child in children:
        output, _ = child.communicate(timeout=300)
        lines = [json.loads(line[len("RESULT "):]) for line in output.splitlines()
                 if line.startswith("RESULT ")]
        assert child.returncode == 0 and lines, output[-3000:]
        results += lines
    return results


def test_data_parallel_configurations_run_with_the_real_libraries(dist_results):
    expected = {
        "ddp": "DistributedDataParallel", "zero": "DeepSpeedEngine", "fsdp": None}
    assert len(dist_results) == sum(len(g) for g in DIST_GROUPS)
    for result in dist_results:
        raw = result["raw"]
        assert "error" not in result, f"{raw}: {result.get('error')}"
        record, p = result["record"], result["plan"]
        assert record["status"] == "ok", record.get("reason")
        assert schema.validate_result(record) == []
        dist = record["model"]["applied"]["dist"]
        assert dist["backend"] == "gloo" and dist["world_size"] == 1
        library = next(k for k in ("ddp", "zero", "fsdp") if k in raw)
        if expected[library]:
            assert dist["wrapper"] == expected[library]
        if library == "zero":
            assert dist["zero_stage"] == raw["zero"] and dist["inner_optimizer"] == "AdamW"
            assert dist["zero_init"] == (raw["zero"] == 3 and not raw.get("no_zero_init"))
        if library == "fsdp":
            assert dist["fsdp_units"] >= 3  # the root and each of the two decoder layers
        steps = p["steps"]
        for phase in ("forward", "backward", "optimizer"):
            assert sum(ph["phase"] == phase for ph in record["phases"]) == steps
        assert record["model"]["parameters"] > 0  # ZeRO-3 counts ds_numel, not 0-size shards
        if raw.get("finetune") == "lora":
            assert 0 < record["model"]["trainable_parameters"] < record["model"]["parameters"]


def test_fsdp1_lora_gets_peft_wrap_policy_as_the_trainer_sets_it(dist_results):
    lora = next(r for r in dist_results if r["raw"].get("fsdp_version") == 1)
    names = lora["record"]["model"]["applied"]["dist"]["fsdp_unit_names"]
    assert any("lora_A" in n for n in names)  # peft's fsdp_auto_wrap_policy: adapters alone
