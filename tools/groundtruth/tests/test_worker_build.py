"""The worker executes the plan: which transformers / PEFT calls it makes, checked on CPU
with stand-in `transformers` and `peft` modules (the real ones are not needed here)."""

import json
import sys
import types

import pytest

from gtlib import knobs, models, plan, worker

torch = pytest.importorskip("torch")


class Calls(list):
    def names(self):
        return [c[0] for c in self]


@pytest.fixture
def fakes(monkeypatch):
    calls = Calls()

    class FakeConfig:
        def __init__(self, d):
            self.__dict__.update(d)

    class FakeHF(torch.nn.Module):
        base_model_prefix = "model"

        def __init__(self, config):
            super().__init__()
            self.config = config
            self.model = torch.nn.Linear(4, 4)
            self.lm_head = torch.nn.Linear(4, 10, bias=False)
            self.is_gradient_checkpointing = False

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            calls.append(("gradient_checkpointing_enable", gradient_checkpointing_kwargs))
            self.is_gradient_checkpointing = True

        def enable_input_require_grads(self):
            calls.append(("enable_input_require_grads", None))
            self._require_grads_hook = object()

        def get_output_embeddings(self):
            return self.lm_head

    class AutoConfig:
        @staticmethod
        def from_pretrained(path, local_files_only=False):
            with open(f"{path}/config.json") as f:
                d = json.load(f)
            calls.append(("AutoConfig.from_pretrained", local_files_only))
            return FakeConfig(d)

    class AutoModelForCausalLM:
        @staticmethod
        def from_config(config, **kwargs):
            calls.append(("from_config", kwargs))
            config._attn_implementation = kwargs["attn_implementation"]
            return FakeHF(config)

    tf = types.ModuleType("transformers")
    tf.__version__ = "5.17.0"
    tf.AutoConfig = AutoConfig
    tf.AutoModelForCausalLM = AutoModelForCausalLM
    monkeypatch.setitem(sys.modules, "transformers", tf)

    class PeftModel(torch.nn.Module):
        def __init__(self, base, config):
            super().__init__()
            self.base = base
            self.peft_config = {"default": config}
            for p in base.parameters():
                p.requires_grad = False
            self.adapter = torch.nn.Linear(4, 2, bias=False)

        def get_base_model(self):
            return self.base

    peft = types.ModuleType("peft")
    peft.LoraConfig = lambda **kw: calls.append(("LoraConfig", kw)) or kw
    peft.get_peft_model = lambda m, c: calls.append(("get_peft_model", None)) or PeftModel(m, c)
    monkeypatch.setitem(sys.modules, "peft", peft)
    return calls


def build(model_dirs, **raw):
    k = knobs.normalize_knobs({"model": "tiny-llama", "seq": 16, **raw})
    resolved = models.resolve_model("tiny-llama", model_dirs)
    p = plan.make_plan(k, resolved.config)
    job = {"model": {"config": resolved.config, "alias": "tiny-llama", "hub_id": None,
                     "source": resolved.source}}
    model, hf, applied = worker.build_model(torch, job, p, "/nonexistent", device="cpu")
    return model, hf, applied, p, job


def test_full_finetune_calls(fakes, model_dirs):
    model, hf, applied, p, job = build(model_dirs, precision="bf16", attn="eager", grad_ckpt="full")
    assert fakes.names() == ["AutoConfig.from_pretrained", "from_config",
                             "gradient_checkpointing_enable"]
    assert fakes[0][1] is True  # local_files_only: never a download
    assert fakes[1][1] == {"dtype": torch.bfloat16, "attn_implementation": "eager"}
    assert fakes[2][1] == {"use_reentrant": False}
    assert hf.config.use_cache is False
    assert model.training
    assert applied["attn_implementation"] == "eager"
    assert applied["gradient_checkpointing"] is True
    assert applied["dtype_kwarg"] == "dtype"
    facts = worker.model_facts(torch, model, hf, job["model"], applied)
    assert facts["parameters"] == facts["trainable_parameters"] == 4 * 4 + 4 + 40
    assert facts["lora_modules"] is None
    assert set(facts["parameter_bytes_by_dtype"]) == {"float32"}  # the stand-in ignores dtype


def test_lora_with_reentrant_checkpointing_calls(fakes, model_dirs):
    model, hf, applied, p, job = build(model_dirs, finetune="lora", lora_rank=4,
                                       grad_ckpt="reentrant")
    assert fakes.names() == ["AutoConfig.from_pretrained", "from_config",
                             "gradient_checkpointing_enable", "LoraConfig", "get_peft_model",
                             "enable_input_require_grads"]
    lora_kwargs = fakes[3][1]
    assert lora_kwargs == {"r": 4, "lora_alpha": 8, "lora_dropout": 0.05,
                           "target_modules": p["lora"]["target_modules"], "bias": "none",
                           "task_type": "CAUSAL_LM", "fan_in_fan_out": False}
    assert hf is model.get_base_model()
    facts = worker.model_facts(torch, model, hf, job["model"], applied)
    assert facts["trainable_parameters"] == 8
    assert facts["lora_modules"] == 0  # the stand-in wraps no module


def test_old_transformers_gets_torch_dtype(fakes, model_dirs, monkeypatch):
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.46.3")
    build(model_dirs, precision="fp32")
    assert fakes[1][1] == {"torch_dtype": torch.float32, "attn_implementation": "sdpa"}


def test_optimizer_and_loss_from_plan(fakes, model_dirs):
    model, hf, applied, p, job = build(model_dirs, optimizer="adamw-forloop", loss="chunked")
    opt = worker.build_optimizer(torch, model, p["optimizer"])
    assert isinstance(opt, torch.optim.AdamW)
    assert opt.defaults["lr"] == 1e-5 and opt.defaults["foreach"] is False
    assert worker.build_optimizer(torch, model, None) is None


class FakeMemory:
    def __init__(self):
        self.calls = []

    def _record_memory_history(self, enabled=None, **kwargs):
        self.calls.append(("record", enabled))

    def _dump_snapshot(self, path):
        self.calls.append(("dump", path))


def _snapshot_calls(first):
    memory = FakeMemory()
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(memory=memory))
    hooks = worker.SnapshotHooks(fake_torch, "s.pickle", 2, 100, first=first)
    for step in (1, 2, 3):
        hooks.before_step(step)
        memory.calls.append(("step", step))
        hooks.after_step(step)
    return memory.calls


def test_snapshot_records_step_two_by_default():
    assert _snapshot_calls(None) == [("step", 1), ("record", "all"), ("step", 2),
                                     ("dump", "s.pickle"), ("record", None), ("step", 3)]


def test_snapshot_from_step_one_spans_both_steps():
    assert _snapshot_calls(1) == [("record", "all"), ("step", 1), ("step", 2),
                                  ("dump", "s.pickle"), ("record", None), ("step", 3)]
