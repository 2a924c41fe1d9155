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
    # What the module says about itself is what a name or a config needs as knobs:
    # from_config builds the weights in the config's dtype (transformers 5: bf16 weights are
    # --precision bf16) and picks the attention (eager for Gemma 2).
    said = vramscope._model.object_knobs(model)
    assert set(said) <= {"precision", "attn"}, said
    knobs.update(said)
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
    # The module's bf16 weights (from_config in the config's dtype) say --precision bf16.
    assert vramscope._model.object_knobs(model) == {"precision": "bf16", "attn": "sdpa"}
    points = [p["peak_allocated_bytes"] for p in vramscope.sweep(
        "qwen2.5-0.5b", **sweep, precision="bf16").points]
    assert [p["peak_allocated_bytes"] for p in vramscope.sweep(model, **sweep).points] == points
    assert vramscope.fit(config, gpu="l4").max_batch == vramscope.fit("qwen2.5-0.5b",
                                                                     gpu="l4").max_batch
    assert vramscope.fit(model, gpu="l4").max_batch == vramscope.fit(
        "qwen2.5-0.5b", gpu="l4", precision="bf16").max_batch


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


# --- Issue 40: the real object, CPU runs, the GPU the run is on ----------------------------

LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1, "target_modules": ["q_proj", "v_proj",
                                                                           "o_proj"]}
LORA_KNOBS = {"finetune": "lora", "lora_rank": 4, "lora_targets": "q,v,o", "lora_dropout": 0.1}


def saved_tiny_llama(tmp_path, dtype=None):
    """A tiny Llama built from its config and saved (config.json + model.safetensors): the
    model directory `estimate(path)` reads, and the module itself."""
    model = tiny_llama()
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(tmp_path / "tiny")
    return model, tmp_path / "tiny"


def test_peft_model_is_its_adapters_over_its_base_counted_once(tmp_path):
    peft = pytest.importorskip("peft")
    model, path = saved_tiny_llama(tmp_path)
    base_params = sum(p.numel() for p in model.parameters())
    lora = peft.get_peft_model(model, peft.LoraConfig(**LORA))
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    got = vramscope.estimate(lora, batch=2, seq=64)
    want = vramscope.estimate(str(path), batch=2, seq=64, **LORA_KNOBS)
    for key in NUMBERS:
        assert got.data[key] == want.data[key], key
    # Base weights once (not base_layer and the original both), the adapters trainable.
    assert got.model["parameters"] == base_params + trainable
    assert got.model["trainable_parameters"] == trainable


def test_peft_model_on_the_meta_device_equals_the_catalog_model():
    peft = pytest.importorskip("peft")
    model = meta_model(catalog_config("qwen2.5-0.5b"))
    lora = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_dropout=0.0,
                                                       target_modules="all-linear"))
    got = vramscope.estimate(lora, seq=512)
    # The catalog's config is bf16, so from_config's base weights are bf16.
    want = vramscope.estimate("qwen2.5-0.5b", seq=512, finetune="lora", lora_rank=8,
                              lora_targets="q,k,v,o,gate,up,down", lora_dropout=0.0,
                              precision="bf16")
    for key in NUMBERS:
        assert got.data[key] == want.data[key], key


def test_a_bf16_module_is_estimated_with_bf16_weights(tmp_path):
    peft = pytest.importorskip("peft")
    model, path = saved_tiny_llama(tmp_path, torch.bfloat16)
    got = vramscope.estimate(model, seq=64)
    assert got.knobs["precision"] == "bf16"
    assert got.data["breakdown_at_peak"] == vramscope.estimate(
        str(path), seq=64, precision="bf16").data["breakdown_at_peak"]
    # PEFT upcasts the adapters to fp32 (autocast_adapter_dtype=True): the default adapter
    # dtype; made without the upcast they are the model's dtype.
    lora = peft.get_peft_model(model, peft.LoraConfig(**LORA))
    want = vramscope.estimate(str(path), seq=64, precision="bf16", **LORA_KNOBS)
    assert vramscope.estimate(lora, seq=64).data["peak_allocated_bytes"] == \
        want.data["peak_allocated_bytes"]
    model16, _ = saved_tiny_llama(tmp_path / "b", torch.bfloat16)
    same = peft.get_peft_model(model16, peft.LoraConfig(**LORA), autocast_adapter_dtype=False)
    assert vramscope.estimate(same, seq=64).knobs["lora_dtype"] == "model"
    # Knobs given win over what the object says.
    assert vramscope.estimate(model, seq=64, precision="fp32").knobs["precision"] == "fp32"


def test_a_4bit_peft_model_is_qlora(tmp_path):
    peft = pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    _, path = saved_tiny_llama(tmp_path, torch.bfloat16)
    quantization = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16)
    # bitsandbytes 0.50.2 quantizes on the CPU too (the fidelity grid's QLoRA path).
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, quantization_config=quantization, device_map="cpu", dtype=torch.bfloat16)
    model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    qlora = peft.get_peft_model(model, peft.LoraConfig(**LORA))
    got = vramscope.estimate(qlora, seq=64)
    assert got.knobs["finetune"] == "qlora"
    want = vramscope.estimate(str(path), seq=64, **{**LORA_KNOBS, "finetune": "qlora"},
                              precision="bf16")
    for key in NUMBERS:
        assert got.data[key] == want.data[key], key
    # The packed uint8 storage is read as the weights' own shapes.
    assert got.model["parameters"] == want.model["parameters"]


class Cuda:
    """torch.cuda on a CPU machine: a GPU named `name` with `total` bytes, whose allocator
    reaches the peaks given and whose other memory (context, other processes) is `outside`."""

    def __init__(self, monkeypatch, name, total, allocated, reserved, outside=500 * MiB):
        self.reserved_now, self.resets = 0, 0
        cuda = torch.cuda
        for attr, value in {
                "is_available": lambda: True, "current_device": lambda: 0,
                "get_device_name": lambda device=None: name,
                "mem_get_info": lambda device=None: (total - outside - self.reserved_now, total),
                "memory_reserved": lambda device=None: self.reserved_now,
                "max_memory_allocated": lambda device=None: allocated,
                "max_memory_reserved": lambda device=None: reserved,
                "reset_peak_memory_stats": lambda device=None: self._reset()}.items():
            monkeypatch.setattr(cuda, attr, value)
        self.reserved = reserved

    def _reset(self):
        self.resets += 1

    def run_step(self):
        self.reserved_now = self.reserved  # the allocator keeps what it reserved


@pytest.fixture
def fresh_warnings(monkeypatch):
    from vramscope import _device
    monkeypatch.setattr(_device, "_warned", set())


def test_cpu_trainer_train_with_the_callback_completes(tmp_path, fresh_warnings):
    """No CUDA: the callback predicts, warns once, measures nothing and never breaks
    train() (torch.cuda.reset_peak_memory_stats raises on a CPU build)."""
    assert not torch.cuda.is_available()
    data = [{"input_ids": torch.randint(0, 512, (32,))} for _ in range(8)]
    for row in data:
        row["labels"] = row["input_ids"].clone()
    out = io.StringIO()
    callback = MemoryCheckCallback(check_after_steps=2, record=tmp_path / "run.jsonl", out=out)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, max_steps=3,
        use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no")
    with pytest.warns(vramscope.CheckWarning, match="CUDA is not available"):
        result = transformers.Trainer(model=tiny_llama(), args=args, train_dataset=data,
                                      callbacks=[callback]).train()
    assert result.global_step == 3
    assert "vramscope: predicted" in out.getvalue()
    assert callback.record is None and callback.check.measured is None
    assert not (tmp_path / "run.jsonl").exists()


def test_check_without_cuda_predicts_and_measures_nothing(fresh_warnings):
    model = tiny_llama()
    with pytest.warns(vramscope.CheckWarning):
        with vramscope.check(model, "adamw", batch=2, seq=16, out=io.StringIO()) as check:
            model(input_ids=torch.randint(0, 512, (2, 16)))
    assert check.prediction is not None and check.measured is None


def test_check_predicts_for_the_gpu_it_runs_on_and_compares_like_with_like(
        tmp_path, monkeypatch):
    gib = 1 << 30
    cuda = Cuda(monkeypatch, "NVIDIA A100-SXM4-40GB", 40 * gib, 3 * gib, 4 * gib)
    out = io.StringIO()
    model = tiny_llama()
    with vramscope.check(model, "adamw", batch=2, seq=16, steps=2, precision="fp32",
                         record=tmp_path / "gpu.jsonl", out=out) as check:
        cuda.run_step()
    assert check.prediction.gpu["name"] == "a100-40g"
    assert cuda.resets == 1
    assert check.measured == {"peak_allocated_bytes": 3 * gib, "peak_reserved_bytes": 4 * gib,
                              "peak_device_used_bytes": 4 * gib + 500 * MiB}
    text = out.getvalue()
    predicted = check.prediction.data
    assert (f"peak allocated: measured 3.00 GiB, predicted "
            f"{predicted['peak_allocated_bytes'] / gib:.2f} GiB") in text
    assert (f"device used: measured 4.49 GiB, predicted "
            f"{predicted['device_total_bytes'] / gib:.2f} GiB") in text
    [line] = (tmp_path / "gpu.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["memory"]["device_total_bytes"] == 40 * gib
    assert record["memory"]["cuda_context_bytes"] == 500 * MiB
    assert record["memory"]["peak_device_used_bytes"] == 4 * gib + 500 * MiB
    assert record["env"]["gpu"] == {"name": "a100-40g", "device_name": "NVIDIA A100-SXM4-40GB",
                                    "total_memory_bytes": 40 * gib}
    [row] = validate(tmp_path / "gpu.jsonl")["rows"]
    assert row["measured"]["device_bytes"] == 4 * gib + 500 * MiB


def test_check_on_a_gpu_the_catalog_lacks_predicts_for_the_nearest_memory(
        monkeypatch, fresh_warnings):
    gib = 1 << 30
    Cuda(monkeypatch, "NVIDIA RTX 6000 Ada Generation", 48 * gib, gib, gib)
    with pytest.warns(vramscope.CheckWarning, match="not in the GPU catalog"):
        check = vramscope.check(tiny_llama(), "adamw", batch=1, seq=16, out=io.StringIO())
        check.predict()
    totals = {g["name"]: g["total_bytes"] for g in vramscope.gpus()}
    chosen = check.prediction.gpu["name"]
    assert all(abs(totals[chosen] - 48 * gib) <= abs(t - 48 * gib) for t in totals.values())


def test_adapters_the_knobs_cannot_express_are_a_warning():
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(tiny_llama(), peft.LoraConfig(
        r=4, target_modules=["q_proj"], layers_to_transform=[0]))
    with pytest.warns(vramscope._peft.PeftWarning, match="the model trains"):
        vramscope.estimate(lora, seq=32)
