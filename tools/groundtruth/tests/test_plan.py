"""Knob -> runtime plan translation (what torch / transformers / PEFT calls are made)."""

import json
import re

import pytest

from gtlib import knobs, models, plan


def make(model_dirs, **raw):
    k = knobs.normalize_knobs({"model": "tiny-llama", "seq": 128, **raw})
    return plan.make_plan(k, models.resolve_model(k["model"], model_dirs).config)


@pytest.mark.parametrize("precision, weights, autocast, scaler", [
    ("fp32", "float32", None, False),
    ("bf16-mixed", "float32", "bfloat16", False),
    ("fp16-mixed", "float32", "float16", True),
    ("bf16", "bfloat16", None, False),
    ("fp16", "float16", None, False),  # GradScaler refuses fp16 gradients
])
def test_precision(model_dirs, precision, weights, autocast, scaler):
    p = make(model_dirs, precision=precision)
    assert p["build"]["dtype"] == weights
    assert p["precision"] == {"weights_dtype": weights, "autocast_dtype": autocast,
                              "grad_scaler": scaler}


def test_no_scaler_without_optimizer(model_dirs):
    assert make(model_dirs, precision="fp16-mixed", optimizer="none")["precision"]["grad_scaler"] is False


@pytest.mark.parametrize("optimizer, module, cls, kwargs", [
    ("none", None, None, None),
    ("sgd", "torch.optim", "SGD", {"lr": 1e-5}),
    ("sgd-momentum", "torch.optim", "SGD", {"lr": 1e-5, "momentum": 0.9}),
    ("adamw", "torch.optim", "AdamW", {"lr": 1e-5}),
    ("adamw-foreach", "torch.optim", "AdamW", {"lr": 1e-5, "foreach": True}),
    ("adamw-fused", "torch.optim", "AdamW", {"lr": 1e-5, "fused": True}),
    ("adamw-forloop", "torch.optim", "AdamW", {"lr": 1e-5, "foreach": False}),
    ("adamw-8bit", "bitsandbytes.optim", "AdamW8bit", {"lr": 1e-5}),
    ("paged-adamw-8bit", "bitsandbytes.optim", "PagedAdamW8bit", {"lr": 1e-5}),
    ("adafactor", "transformers.optimization", "Adafactor",
     {"lr": 1e-5, "scale_parameter": False, "relative_step": False}),
])
def test_optimizers(model_dirs, optimizer, module, cls, kwargs):
    p = make(model_dirs, optimizer=optimizer)
    if module is None:
        assert p["optimizer"] is None
        assert p["zero_grad"] == "model.zero_grad(set_to_none=True)"
        return
    assert p["optimizer"] == {"module": module, "class": cls, "kwargs": kwargs}
    assert ("bitsandbytes" in p["requires"]) == module.startswith("bitsandbytes")


def test_full_finetune_plan_is_plain(model_dirs):
    p = make(model_dirs)
    assert p["build"]["method"] == "from_config"
    assert p["build"]["model_class"] == "AutoModelForCausalLM"
    assert p["build"]["attn_implementation"] == "sdpa"
    assert p["build"]["use_cache"] is False
    assert p["lora"] is None and p["gradient_checkpointing"] is None
    assert p["requires"] == ["torch", "transformers"]
    assert p["batch"]["shape"] == [1, 128] and p["batch"]["vocab_size"] == 1000
    assert p["loss"] == {"kind": "hf"}
    json.dumps(p)  # plain data


@pytest.mark.parametrize("ckpt, expected", [
    ("none", None), ("full", {"use_reentrant": False}), ("reentrant", {"use_reentrant": True}),
])
def test_checkpointing(model_dirs, ckpt, expected):
    assert make(model_dirs, grad_ckpt=ckpt)["gradient_checkpointing"] == expected


def test_enable_input_require_grads_only_for_reentrant_adapters(model_dirs):
    assert make(model_dirs, grad_ckpt="reentrant", finetune="lora")["enable_input_require_grads"]
    assert not make(model_dirs, grad_ckpt="reentrant")["enable_input_require_grads"]
    assert not make(model_dirs, grad_ckpt="full", finetune="lora")["enable_input_require_grads"]


def test_lora_llama(model_dirs):
    p = make(model_dirs, finetune="lora", lora_rank=8, lora_targets="q,v,down")
    lora = p["lora"]
    assert (lora["r"], lora["lora_alpha"], lora["lora_dropout"]) == (8, 16, 0.05)
    assert lora["target_module_suffixes"] == ["q_proj", "v_proj", "down_proj"]
    assert lora["task_type"] == "CAUSAL_LM" and lora["fan_in_fan_out"] is False
    rx = re.compile(lora["target_modules"])
    assert rx.fullmatch("model.layers.0.self_attn.q_proj")
    assert rx.fullmatch("model.layers.11.mlp.down_proj")
    assert not rx.fullmatch("model.layers.0.self_attn.k_proj")
    assert not rx.fullmatch("model.layers.0.self_attn.q_proj.lora_A")
    assert "peft" in p["requires"]


def test_lora_all_linear_passes_through(model_dirs):
    lora = make(model_dirs, finetune="lora", lora_targets="all-linear")["lora"]
    assert lora["target_modules"] == "all-linear"


def test_lora_phi3_fused_projections(model_dirs):
    p = make(model_dirs, model="tiny-phi3", finetune="lora", lora_targets="q,gate")
    assert p["lora"]["target_module_suffixes"] == ["qkv_proj", "gate_up_proj"]
    assert any("fused projection" in n for n in p["notes"])


def test_lora_gpt2_conv1d_and_missing_gate(model_dirs):
    p = make(model_dirs, model="tiny-gpt2", finetune="lora", lora_targets="q,o,gate,up,down")
    lora = p["lora"]
    assert lora["fan_in_fan_out"] is True
    rx = re.compile(lora["target_modules"])
    assert rx.fullmatch("transformer.h.3.attn.c_attn")
    assert rx.fullmatch("transformer.h.3.attn.c_proj")
    assert rx.fullmatch("transformer.h.3.mlp.c_proj")
    assert rx.fullmatch("transformer.h.3.mlp.c_fc")
    assert any("no 'gate'" in n for n in p["notes"])


def test_lora_bert_ambiguous_output_dense(model_dirs):
    p = make(model_dirs, model="tiny-bert", finetune="lora", lora_targets="down")
    assert p["task"] == "masked-lm"
    assert p["build"]["model_class"] == "AutoModelForMaskedLM"
    assert p["lora"]["task_type"] is None
    rx = re.compile(p["lora"]["target_modules"])
    assert rx.fullmatch("bert.encoder.layer.1.output.dense")
    assert not rx.fullmatch("bert.encoder.layer.1.attention.output.dense")


def test_qlora(model_dirs):
    p = make(model_dirs, finetune="qlora", precision="bf16-mixed")
    assert p["build"]["method"] == "from_pretrained_4bit"
    assert p["build"]["quantization"] == {
        "load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16"}
    assert p["build"]["prepare_model_for_kbit_training"] is True
    assert p["precision"]["autocast_dtype"] == "bfloat16"
    assert {"peft", "bitsandbytes"} <= set(p["requires"])


def test_chunked_loss(model_dirs):
    p = make(model_dirs, model="tiny-gemma2", loss="chunked")
    assert p["loss"] == {"kind": "chunked", "chunks": 8, "split": "flattened tokens",
                         "checkpoint_each_chunk": False, "final_logit_softcapping": 30.0}


def test_grad_accum(model_dirs):
    p = make(model_dirs, grad_accum=4)
    assert p["batch"]["micro_batches_per_step"] == 4
    assert p["batch"]["loss_scaling"] == "loss / grad_accum"


def test_attention(model_dirs):
    assert make(model_dirs, attn="eager")["build"]["attn_implementation"] == "eager"
    p = make(model_dirs, attn="flash", precision="bf16")
    assert p["build"]["attn_implementation"] == "flash_attention_2"
    assert "flash_attn" in p["requires"]


@pytest.mark.parametrize("raw, message", [
    ({"model": "tiny-gpt2", "seq": 129}, "learned positions"),
    ({"loss": "fused-linear"}, "Liger-Kernel"),
    ({"model": "tiny-bert", "loss": "chunked"}, "causal LMs only"),
    ({"attn": "flash", "precision": "fp32"}, "fp16/bf16"),
    ({"model": "tiny-gpt2", "finetune": "lora", "lora_targets": "gate"}, "select no module"),
    ({"finetune": "qlora", "precision": "fp32"}, "16-bit compute dtype"),
])
def test_skips(model_dirs, raw, message):
    with pytest.raises(plan.PlanSkip, match=message):
        make(model_dirs, **raw)


def test_unknown_architecture_lora_and_vocab():
    k = knobs.normalize_knobs({"model": "x", "finetune": "lora", "seq": 8})
    with pytest.raises(plan.PlanSkip, match="no LoRA module-name mapping"):
        plan.make_plan(k, {"model_type": "mamba", "vocab_size": 10})
    with pytest.raises(plan.PlanSkip, match="vocab_size"):
        plan.make_plan(k, {"model_type": "llama"})


def test_rope_models_may_exceed_max_positions(model_dirs):
    p = make(model_dirs, seq=512)  # tiny-llama has max_position_embeddings 256
    assert any("exceeds max_position_embeddings" in n for n in p["notes"])
