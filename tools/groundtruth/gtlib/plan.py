"""Knobs -> runtime plan: which torch / transformers / PEFT calls a configuration maps to.

The plan is plain data (JSON-serialisable), computed without importing torch,
transformers or PEFT, so it can be tested anywhere and recorded with each
result. The worker (worker.py) only executes what the plan says.

Choices made here, each documented in docs/groundtruth.md:
  * LoRA: lora_alpha = 2 * r, bias "none", PEFT's default fp32 adapters
    (get_peft_model(autocast_adapter_dtype=True)); target names mapped per
    architecture (LORA_MODULES); fused projections (phi3 qkv_proj,
    gate_up_proj; gpt2 c_attn) are adapted whole when any part is selected.
  * QLoRA: bitsandbytes 4-bit NF4 with double quantisation, compute dtype from
    the precision knob, then peft.prepare_model_for_kbit_training (which casts
    every non-4-bit parameter to fp32) and get_peft_model.
  * Optimizers: lr 1e-5 and the library defaults otherwise.
  * Data-parallel knobs (DDP, DeepSpeed, FSDP at world size 1): the plan's
    `dist` part, gtlib/dist_plan.py.
  * Chunked loss (as src/lower/loss.cc models it): torchtune
    CEWithChunkedOutputLoss style, the decoder's last hidden state split into
    LOSS_CHUNKS token blocks, each through lm_head + fp32 cross-entropy, no
    checkpointing.
"""

from __future__ import annotations

import re

PLAN_VERSION = 1
LEARNING_RATE = 1e-5
LOSS_CHUNKS = 8

MASKED_LM_TYPES = ("bert", "roberta")
# Models with learned absolute positions cannot run past this many tokens.
LEARNED_POSITION_KEYS = {"gpt2": "n_positions", "bert": "max_position_embeddings",
                         "roberta": "max_position_embeddings", "opt": "max_position_embeddings"}

_LLAMA_STYLE = {
    "q": ["q_proj"], "k": ["k_proj"], "v": ["v_proj"], "o": ["o_proj"],
    "gate": ["gate_proj"], "up": ["up_proj"], "down": ["down_proj"], "lm_head": ["lm_head"],
}
# Our module names (knobs.LORA_TARGETS) -> module-name suffixes per model_type.
# Entries starting with "re:" are regular expressions for the suffix.
LORA_MODULES = {
    **{t: _LLAMA_STYLE for t in (
        "llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma", "gemma2",
        "gemma3_text", "olmo", "olmo2", "granite")},
    # transformers 4.x Mixtral experts are w1 (gate), w3 (up), w2 (down); v5 fuses them
    # into 3-D parameters that no LoRA target selects (the result's lora_modules says).
    "mixtral": {**_LLAMA_STYLE, "gate": ["w1"], "up": ["w3"], "down": ["w2"]},
    "phi3": {"q": ["qkv_proj"], "k": ["qkv_proj"], "v": ["qkv_proj"], "o": ["o_proj"],
             "gate": ["gate_up_proj"], "up": ["gate_up_proj"], "down": ["down_proj"],
             "lm_head": ["lm_head"]},
    "gpt2": {"q": ["attn.c_attn"], "k": ["attn.c_attn"], "v": ["attn.c_attn"],
             "o": ["attn.c_proj"], "gate": [], "up": ["mlp.c_fc"], "down": ["mlp.c_proj"],
             "lm_head": ["lm_head"]},
    "gpt_neox": {"q": ["attention.query_key_value"], "k": ["attention.query_key_value"],
                 "v": ["attention.query_key_value"], "o": ["attention.dense"], "gate": [],
                 "up": ["mlp.dense_h_to_4h"], "down": ["mlp.dense_4h_to_h"],
                 "lm_head": ["embed_out"]},
    "bert": {"q": ["attention.self.query"], "k": ["attention.self.key"],
             "v": ["attention.self.value"], "o": ["attention.output.dense"], "gate": [],
             "up": ["intermediate.dense"], "down": [r"re:layer\.\d+\.output\.dense"],
             "lm_head": ["cls.predictions.decoder"]},
}
# gpt2 uses transformers' Conv1D (weight stored transposed): PEFT needs fan_in_fan_out.
FAN_IN_FAN_OUT_TYPES = ("gpt2",)

_PRECISIONS = {
    #  knob:        (weights dtype, autocast dtype, 4-bit compute dtype)
    "fp32":       ("float32", None, "float32"),
    "bf16-mixed": ("float32", "bfloat16", "bfloat16"),
    "fp16-mixed": ("float32", "float16", "float16"),
    "bf16":       ("bfloat16", None, "bfloat16"),
    "fp16":       ("float16", None, "float16"),
}

_OPTIMIZERS = {
    "none": None,
    "sgd": ("torch.optim", "SGD", {}),
    "sgd-momentum": ("torch.optim", "SGD", {"momentum": 0.9}),
    "adamw": ("torch.optim", "AdamW", {}),  # PyTorch picks foreach on CUDA
    "adamw-foreach": ("torch.optim", "AdamW", {"foreach": True}),
    "adamw-fused": ("torch.optim", "AdamW", {"fused": True}),
    "adamw-forloop": ("torch.optim", "AdamW", {"foreach": False}),
    "adamw-8bit": ("bitsandbytes.optim", "AdamW8bit", {}),
    "paged-adamw-8bit": ("bitsandbytes.optim", "PagedAdamW8bit", {}),
    "paged-adamw": ("bitsandbytes.optim", "PagedAdamW", {}),
    # HF Trainer's settings for --optim adafactor.
    "adafactor": ("transformers.optimization", "Adafactor",
                  {"scale_parameter": False, "relative_step": False}),
    "lion": ("bitsandbytes.optim", "Lion", {}),
}


class PlanSkip(Exception):
    """The configuration cannot be measured by this harness; the message says why."""


def lora_target_regex(model_type, targets):
    """Returns (regex for PEFT's target_modules, list of suffixes, notes).

    PEFT full-matches a string target_modules against each module's qualified
    name, so the regex accepts any prefix ending in '.'.
    """
    table = LORA_MODULES.get(model_type)
    if table is None:
        raise PlanSkip(
            f"no LoRA module-name mapping for model_type '{model_type}' "
            f"(known: {', '.join(sorted(LORA_MODULES))})")
    suffixes, notes = [], []
    for name in targets.split(","):
        mapped = table.get(name, [])
        if not mapped:
            notes.append(f"{model_type} has no '{name}' projection; not adapted")
        for suffix in mapped:
            if suffix not in suffixes:
                suffixes.append(suffix)
    fused = {s for s in suffixes if sum(s in table.get(n, []) for n in ("q", "k", "v", "gate", "up")) > 1}
    for suffix in sorted(fused):
        notes.append(f"'{suffix}' is a fused projection: adapted whole when any part is selected")
    if not suffixes:
        raise PlanSkip(f"lora_targets '{targets}' select no module of a {model_type} model")
    fragments = [s[3:] if s.startswith("re:") else re.escape(s) for s in suffixes]
    regex = r"(?:.*\.)?(?:" + "|".join(fragments) + ")"
    return regex, suffixes, notes


def make_plan(knobs, model_config):
    """Translates canonical knobs + a config.json dict into a plan dict, or raises PlanSkip."""
    model_type = model_config.get("model_type")
    vocab = model_config.get("vocab_size")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab <= 0:
        raise PlanSkip(f"config.json of '{knobs['model']}' has no positive integer vocab_size")
    masked = model_type in MASKED_LM_TYPES
    notes = []

    seq = knobs["seq"]
    position_key = LEARNED_POSITION_KEYS.get(model_type)
    if position_key and isinstance(model_config.get(position_key), int):
        limit = model_config[position_key]
        if seq > limit:
            raise PlanSkip(f"seq {seq} exceeds {model_type}'s learned positions ({position_key}={limit})")
    elif isinstance(model_config.get("max_position_embeddings"), int):
        if seq > model_config["max_position_embeddings"]:
            notes.append(f"seq {seq} exceeds max_position_embeddings "
                         f"{model_config['max_position_embeddings']} (RoPE runs anyway)")

    weights_dtype, autocast_dtype, compute_dtype = _PRECISIONS[knobs["precision"]]
    requires = ["torch", "transformers"]

    attn = {"eager": "eager", "sdpa": "sdpa", "flash": "flash_attention_2"}[knobs["attn"]]
    if knobs["attn"] == "flash":
        requires.append("flash_attn")
        if weights_dtype == "float32" and autocast_dtype is None:
            raise PlanSkip("flash attention needs fp16/bf16 tensors; precision fp32 has none")

    build = {
        "method": "from_config",
        "model_class": "AutoModelForMaskedLM" if masked else "AutoModelForCausalLM",
        "device": "cuda",
        "dtype": weights_dtype,
        "attn_implementation": attn,
        "use_cache": False,
        "random_init": True,
    }
    if knobs["finetune"] == "qlora":
        if knobs["precision"] == "fp32":
            raise PlanSkip("qlora needs a 16-bit compute dtype (as `vramscope estimate` says); "
                           "use precision bf16 or bf16-mixed")
        requires += ["peft", "bitsandbytes"]
        build.update({
            "method": "from_pretrained_4bit",
            "dtype": compute_dtype,
            "quantization": {
                "load_in_4bit": True,
                "bnb_4bit_quant_type": "nf4",
                "bnb_4bit_use_double_quant": True,
                "bnb_4bit_compute_dtype": compute_dtype,
            },
            "source": "random weights in the compute dtype, saved by a helper process",
            "prepare_model_for_kbit_training": True,
        })
        notes.append("prepare_model_for_kbit_training casts every non-4-bit parameter to fp32")

    ckpt = None
    if knobs["grad_ckpt"] != "none":
        ckpt = {"use_reentrant": knobs["grad_ckpt"] == "reentrant"}

    lora = None
    if knobs["finetune"] in ("lora", "qlora"):
        if "peft" not in requires:
            requires.append("peft")
        r = knobs["lora_rank"]
        if knobs["lora_targets"] == "all-linear":
            target, suffixes = "all-linear", ["all-linear"]
        else:
            target, suffixes, lora_notes = lora_target_regex(model_type, knobs["lora_targets"])
            notes += lora_notes
        lora = {
            "r": r,
            "lora_alpha": 2 * r,
            "lora_dropout": knobs["lora_dropout"],
            "target_modules": target,
            "target_module_suffixes": suffixes,
            "bias": "none",
            "task_type": None if masked else "CAUSAL_LM",
            "fan_in_fan_out": model_type in FAN_IN_FAN_OUT_TYPES,
            "adapter_dtype": "float32",
        }

    optimizer = None
    spec = _OPTIMIZERS[knobs["optimizer"]]
    if spec is not None:
        module, cls, kwargs = spec
        optimizer = {"module": module, "class": cls, "kwargs": {"lr": LEARNING_RATE, **kwargs}}
        if module.startswith("bitsandbytes") and "bitsandbytes" not in requires:
            requires.append("bitsandbytes")

    if knobs["loss"] == "fused-linear":
        raise PlanSkip("loss fused-linear needs Liger-Kernel, which this harness does not drive yet")
    if knobs["loss"] == "chunked":
        if masked:
            raise PlanSkip("loss chunked is defined for causal LMs only")
        loss = {"kind": "chunked", "chunks": LOSS_CHUNKS, "split": "flattened tokens",
                "checkpoint_each_chunk": False,
                "final_logit_softcapping": model_config.get("final_logit_softcapping")}
    else:
        loss = {"kind": "hf"}

    plan = {
        "plan_version": PLAN_VERSION,
        "task": "masked-lm" if masked else "causal-lm",
        "model_type": model_type,
        "build": build,
        "precision": {
            "weights_dtype": weights_dtype,
            "autocast_dtype": autocast_dtype,
            "grad_scaler": knobs["precision"] == "fp16-mixed" and optimizer is not None,
        },
        "gradient_checkpointing": ckpt,
        "enable_input_require_grads": bool(ckpt and ckpt["use_reentrant"] and knobs["finetune"] != "full"),
        "lora": lora,
        "optimizer": optimizer,
        "zero_grad": "optimizer.zero_grad(set_to_none=True)" if optimizer
                     else "model.zero_grad(set_to_none=True)",
        "loss": loss,
        "batch": {
            "shape": [knobs["batch"], seq],
            "vocab_size": vocab,
            "labels": "input_ids",
            "micro_batches_per_step": knobs["grad_accum"],
            "loss_scaling": "loss / grad_accum" if knobs["grad_accum"] > 1 else None,
        },
        "steps": knobs["steps"],
        "alloc_conf": knobs["alloc_conf"],
        "requires": requires,
        "notes": notes,
    }
    from . import dist_plan  # imports this module: a cycle if done at the top
    return dist_plan.add_dist(plan, knobs, model_config)
