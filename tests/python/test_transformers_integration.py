"""The Python package with real transformers and torch (.venv/tf5): models given as Python
objects, and the run-time checks (vramscope.check, MemoryCheckCallback) on CPU under a
fake CUDA memory reader, their records read back by `vramscope validate`.

    .venv/tf5/bin/python -m pytest -q tests/python    # after scripts/build.sh
"""
import io
import json
import os
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
sys.path.insert(0, os.environ.get("VRAMSCOPE_PYTHONPATH",
                                  str(pathlib.Path(BIN).parents[1] / "python")))

import vramscope  # noqa: E402
from vramscope.integrations.transformers import MemoryCheckCallback  # noqa: E402

MiB = 1 << 20
# What a report says about the memory (not its name or source).
NUMBERS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes", "fits",
           "breakdown_at_peak", "phases", "top_allocations", "live_at_peak_count", "knobs",
           "assumptions")


def catalog_config(alias):
    data = json.loads((ROOT / "data" / "models" / f"{alias}.json").read_text())
    data.pop("_vramscope", None)
    return transformers.AutoConfig.for_model(**data)


def meta_model(config):
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("alias", ["llama-3-8b", "qwen2.5-0.5b", "mistral-7b-v0.3", "gemma-2-2b", "phi-3-mini-4k", "qwen3-30b-a3b", "mixtral-8x7b",
                                   "qwen1.5-moe-a2.7b"])
def test_meta_module_config_and_catalog_give_the_same_estimate(alias):
    config = catalog_config(alias)
    model = meta_model(config)
    knobs = {"batch": 2, "seq": 1024, "finetune": "lora"}
    from_module = vramscope.estimate(model, **knobs)
    from_config = vramscope.estimate(config, **knobs)
    from_catalog = vramscope.estimate(alias, **knobs)
    # The LoRA adapters count too; without them, the module's own count.
    params = sum(p.numel() for p in model.parameters())
    assert vramscope.estimate(model).model["parameters"] == params
    assert vramscope.estimate(config).model["parameters"] == params
    assert from_module.model["parameters"] == from_config.model["parameters"]
    for key in NUMBERS:
        assert from_module.data[key] == from_config.data[key] == from_catalog.data[key], key


def test_searches_take_model_objects():
    config = catalog_config("qwen2.5-0.5b")
    model = meta_model(config)
    sweep = {"seq": "512:2048:3", "finetune": "lora"}
    points = [p["peak_allocated_bytes"] for p in vramscope.sweep("qwen2.5-0.5b", **sweep).points]
    assert [p["peak_allocated_bytes"] for p in vramscope.sweep(model, **sweep).points] == points
    assert vramscope.fit(config, gpu="l4").max_batch == vramscope.fit("qwen2.5-0.5b",
                                                                     gpu="l4").max_batch


def test_meta_module_parameters_are_read_exactly():
    """A module that differs from its config (an extra parameter) is estimated as it is."""
    config = catalog_config("qwen2.5-0.5b")
    model = meta_model(config)
    with torch.device("meta"):
        model.extra = torch.nn.Parameter(torch.empty(1000, 1000))
    report = vramscope.estimate(model)
    assert report.model["parameters"] == sum(p.numel() for p in model.parameters())
    assert report.model["parameters"] == vramscope.estimate(config).model["parameters"] + 10**6


class FakeCudaMemory:
    """torch.cuda's peak counters, on CPU."""

    def __init__(self, allocated, reserved):
        self.allocated, self.reserved, self.resets = allocated, reserved, 0

    def max_memory_allocated(self):
        return self.allocated

    def max_memory_reserved(self):
        return self.reserved

    def reset_peak_memory_stats(self):
        self.resets += 1


def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def validate(path):
    p = subprocess.run([BIN, "validate", str(path), "--json"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_trainer_callback_writes_a_record_that_validate_reads(tmp_path):
    model = tiny_llama()
    data = [{"input_ids": torch.randint(0, 512, (32,))} for _ in range(8)]
    for row in data:
        row["labels"] = row["input_ids"].clone()
    out = io.StringIO()
    memory = FakeCudaMemory(40 * MiB, 48 * MiB)
    callback = MemoryCheckCallback(check_after_steps=2, record=tmp_path / "run.jsonl",
                                   memory_reader=memory, out=out)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=2,
        use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
        gradient_accumulation_steps=2)
    transformers.Trainer(model=model, args=args, train_dataset=data,
                         callbacks=[callback]).train()
    text = out.getvalue()
    assert "vramscope: predicted" in text and "vramscope: assumed:" in text
    assert "peak allocated: measured 0.04 GiB" in text
    records = (tmp_path / "run.jsonl").read_text().splitlines()
    assert len(records) == 1
    record = json.loads(records[0])
    assert record["knobs"]["batch"] == 2 and record["knobs"]["seq"] == 32
    assert record["knobs"]["grad_accum"] == 2 and record["knobs"]["steps"] == 2
    assert record["knobs"]["precision"] == "fp32"
    assert record["memory"]["peak_allocated_bytes"] == 40 * MiB
    assert memory.resets == 1
    result = validate(tmp_path / "run.jsonl")
    [row] = result["rows"]
    assert row["measured"]["peak_allocated_bytes"] == 40 * MiB
    assert row["predicted"]["peak_allocated_bytes"] == \
        callback.check.prediction.peak_allocated_bytes


def test_check_around_a_plain_loop(tmp_path):
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    memory = FakeCudaMemory(30 * MiB, 32 * MiB)
    with vramscope.check(model, optimizer, batch=2, seq=16, steps=2, precision="fp32",
                         record=tmp_path / "loop.jsonl", memory_reader=memory,
                         out=io.StringIO()) as check:
        for _ in range(2):
            ids = torch.randint(0, 512, (2, 16))
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert check.measured == {"peak_allocated_bytes": 30 * MiB, "peak_reserved_bytes": 32 * MiB}
    assert check.knobs["optimizer"] == "adamw"
    [row] = validate(tmp_path / "loop.jsonl")["rows"]
    assert row["predicted"]["peak_allocated_bytes"] == check.prediction.peak_allocated_bytes


def test_check_of_a_peft_model_estimates_its_config_with_the_lora_knobs():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_llama(), peft.LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj", "o_proj"]))
    check = vramscope.check(model, "adamw", batch=2, seq=16, precision="fp32", out=io.StringIO(),
                            memory_reader=FakeCudaMemory(MiB, MiB))
    assert {k: check.knobs[k] for k in ("finetune", "lora_rank", "lora_targets")} == \
        {"finetune": "lora", "lora_rank": 4, "lora_targets": "q,v,o"}
    report = check.predict()
    want = vramscope.estimate(model.config, **check.knobs)
    assert report.data["peak_allocated_bytes"] == want.data["peak_allocated_bytes"]
    assert report.model["trainable_parameters"] == sum(
        p.numel() for p in model.parameters() if p.requires_grad)


def test_check_records_an_oom(tmp_path):
    class OutOfMemoryError(RuntimeError):  # torch.cuda.OutOfMemoryError's name
        pass

    out = io.StringIO()
    with pytest.raises(OutOfMemoryError):
        with vramscope.check("llama-3.2-1b", record=tmp_path / "oom.jsonl", out=out,
                             memory_reader=FakeCudaMemory(70 << 30, 79 << 30)):
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "vramscope: out of memory" in out.getvalue()
    [line] = (tmp_path / "oom.jsonl").read_text().splitlines()
    assert json.loads(line)["status"] == "oom"
    assert validate(tmp_path / "oom.jsonl")["summary"]["oom_runs"] == 1


def test_oom_dumps_a_snapshot_and_explains_it(tmp_path, monkeypatch):
    """On CUDA out-of-memory the check writes a snapshot (here: a recorded one from the tests'
    data, as if torch had dumped it) and explains it."""
    import shutil

    snapshot = ROOT / "tests" / "data" / "snapshots" / "oom.pickle"
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot",
                        lambda path: shutil.copy(snapshot, path))

    class OutOfMemoryError(RuntimeError):
        pass

    out = io.StringIO()
    check = vramscope.check("llama-3.2-1b", record=tmp_path / "oom.jsonl", out=out,
                            snapshot_path=tmp_path / "oom.pickle",
                            memory_reader=FakeCudaMemory(70 << 30, 79 << 30))
    with pytest.raises(OutOfMemoryError):
        with check:
            raise OutOfMemoryError("CUDA out of memory")
    assert check.explained.data["snapshot"] == vramscope.explain(snapshot).data["snapshot"]
    assert check.explained.text().strip() in out.getvalue()


class Args:
    """The TrainingArguments fields the callback reads."""

    def __init__(self, **fields):
        base = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
                "bf16": True, "fp16": False, "optim": "adamw_torch", "world_size": 8,
                "gradient_checkpointing": False, "deepspeed": None, "fsdp": [],
                "fsdp_config": {}, "hf_deepspeed_config": None}
        self.__dict__.update(base, **fields)


def test_trainer_knobs_read_deepspeed_fsdp_and_ddp(tmp_path):
    from vramscope.integrations.transformers import trainer_knobs

    model = tiny_llama()
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu"}}}))
    knobs = trainer_knobs(Args(deepspeed=str(ds)), model)
    assert knobs == {"batch": 4, "grad_accum": 1, "precision": "bf16-mixed",
                     "optimizer": "adamw", "attn": "sdpa", "gpus": 8, "zero": 3,
                     "offload": "optimizer"}
    knobs = trainer_knobs(Args(fsdp=["full_shard", "auto_wrap"], fsdp_config={"version": 2},
                               gradient_checkpointing=True,
                               gradient_checkpointing_kwargs={"use_reentrant": False}), model)
    assert knobs["fsdp"] == "full" and knobs["fsdp_version"] == 2 and knobs["grad_ckpt"] == "full"
    assert trainer_knobs(Args(), model)["ddp"] is True
    # What they say is something the engine estimates.
    assert vramscope.estimate("llama-3.2-1b", **knobs).data["ranks"]
