"""A model object read as what it is: a PEFT model's adapters and base, a module's dtypes.

PEFT (peft 0.21.2) wraps each targeted layer in a LoRA layer (`tuners/lora/layer.py`
`LoraLayer`): the original layer moves to `<module>.base_layer` and the adapters sit beside
it in the ModuleDicts of `LoraLayer.adapter_layer_names` (`lora_A`, `lora_B`,
`lora_embedding_A`, `lora_embedding_B`, `lora_magnitude_vector`), one entry per adapter name.
`modules_to_save` keeps the original under `original_module` and a trainable copy per
adapter under `modules_to_save` (`utils/other.py` `ModulesToSaveWrapper`). A `PeftModel`
adds `base_model.model.` in front of the transformers model's names (`get_base_model()`);
transformers' own `model.add_adapter` (PeftAdapterMixin) injects the same layers into the
model itself, without the prefix. Both carry `peft_config` ({adapter name: config}).

The engine lowers LoRA and QLoRA from knobs over the base model's parameters, so a PEFT
model becomes the base's parameters under their checkpoint names (counted once: not the
`base_layer` copy and the original both) plus the knobs its LoRA layers say: rank, targets,
dropout, the adapters' dtype, and QLoRA when the base layers hold bitsandbytes 4-bit
weights (`Params4bit`, bitsandbytes 0.50.2 `nn/modules.py`: after quantization the
parameter is packed uint8 [n/2, 1]; `quant_state.shape` and `quant_state.dtype` are the
weight's own shape and dtype).
"""

from __future__ import annotations

import warnings

# LoraLayer.adapter_layer_names (peft 0.21.2 tuners/lora/layer.py), and the per-adapter
# copies of modules_to_save / trainable tokens (utils/other.py): not the base's weights.
_ADAPTER_SEGMENTS = frozenset({"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B",
                               "lora_magnitude_vector", "modules_to_save",
                               "trainable_tokens_delta"})
# Wrappers that hold the base's own layer one level down.
_WRAPPER_SEGMENTS = frozenset({"base_layer", "original_module"})

# PEFT target module names (the layers' leaf names) -> --lora-targets names (the engine's
# parameter roles; a fused q/k/v projection is "q", a fused gate/up one "gate").
_LEAF_TARGETS = {
    "q_proj": "q", "query": "q", "to_q": "q", "q": "q", "c_attn": "q", "query_key_value": "q",
    "qkv_proj": "q", "k_proj": "k", "key": "k", "to_k": "k", "k": "k",
    "v_proj": "v", "value": "v", "to_v": "v", "v": "v", "o_proj": "o", "out_proj": "o", "o": "o",
    "gate_proj": "gate", "gate_up_proj": "gate", "wi_0": "gate", "up_proj": "up", "fc1": "up",
    "c_fc": "up", "dense_h_to_4h": "up", "wi": "up", "wi_1": "up", "down_proj": "down",
    "fc2": "down", "dense_4h_to_h": "down", "wo": "down", "lm_head": "lm_head",
}
_TARGET_ORDER = ("q", "k", "v", "o", "gate", "up", "down", "lm_head")

# torch dtype name -> the --precision whose weights are in that dtype (fp32 weights say
# nothing about autocast: the engine's default stands).
_PRECISION_OF_WEIGHTS = {"bfloat16": "bf16", "float16": "fp16"}


class PeftWarning(UserWarning):
    """A part of a PEFT model that the estimate does not model as it is."""


def is_peft(model) -> bool:
    """A PeftModel, or a transformers model with adapters added (PeftAdapterMixin)."""
    config = getattr(model, "peft_config", None)
    return isinstance(config, dict) and bool(config)


def dtype_name(param) -> str:
    """`param`'s dtype as torch names it ("bfloat16"); a 4-bit weight's own dtype."""
    state = getattr(param, "quant_state", None)
    dtype = getattr(state, "dtype", None) or param.dtype
    return str(dtype).replace("torch.", "")


def stored_shape(param) -> list[int]:
    """The weight's shape as a checkpoint stores it (a packed 4-bit weight's own shape)."""
    state = getattr(param, "quant_state", None)
    shape = getattr(state, "shape", None) if state is not None else None
    return [int(d) for d in (shape if shape is not None else param.shape)]


def _is_4bit(param) -> bool:
    return type(param).__name__ == "Params4bit"


def base_parameters(model):
    """(checkpoint name, parameter) of the base model's weights, each once: adapters and
    modules_to_save copies left out, `base_layer.` and `original_module.` dropped."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for name, param in base.named_parameters():
        parts = name.split(".")
        if _ADAPTER_SEGMENTS.intersection(parts):
            continue
        yield ".".join(p for p in parts if p not in _WRAPPER_SEGMENTS), param


def _lora_layers(model) -> list[tuple[str, object]]:
    """(module name, LoRA layer) of every layer PEFT wrapped (lora_A: a ModuleDict)."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(getattr(m, "r", None), dict) and hasattr(m, "lora_A")
            and hasattr(m, "base_layer")]


def _target(name: str) -> str | None:
    """The --lora-targets name of the layer `name` ("model.layers.0.self_attn.q_proj")."""
    parts = name.split(".")
    leaf = parts[-1]
    if leaf in ("dense", "c_proj"):
        # GPT-2's attn.c_proj / mlp.c_proj, BERT's attention.output.dense /
        # intermediate.dense / output.dense, GPT-NeoX's attention.dense.
        attention = any(p in ("attn", "attention", "self_attention", "self_attn") for p in parts)
        if attention:
            return "o"
        return "up" if "intermediate" in parts else "down" if leaf == "c_proj" or \
            "output" in parts else None
    return _LEAF_TARGETS.get(leaf)


def _active_adapter(model, layers) -> str:
    active = list(getattr(layers[0][1], "active_adapters", None) or ["default"])
    if len(active) > 1:
        warnings.warn(f"PEFT: {len(active)} adapters are active ({', '.join(active)}); only "
                      f"{active[0]}'s are estimated", PeftWarning, stacklevel=4)
    return active[0]


def _adapter_facts(layers, adapter: str):
    """Ranks, targets, dropout probabilities, adapter dtypes and 4-bit bases of the layers."""
    ranks, targets, dropouts, dtypes, unknown = set(), set(), set(), set(), []
    quantized = False
    for name, layer in layers:
        if adapter not in layer.r:
            continue
        ranks.add(int(layer.r[adapter]))
        target = _target(name)
        if target is None:
            unknown.append(name)
        else:
            targets.add(target)
        dropout = layer.lora_dropout[adapter] if adapter in layer.lora_dropout else None
        dropouts.add(float(getattr(dropout, "p", 0.0)))
        if adapter in layer.lora_A:
            dtypes.add(dtype_name(layer.lora_A[adapter].weight))
        base = layer.get_base_layer() if hasattr(layer, "get_base_layer") else layer.base_layer
        quantized = quantized or _is_4bit(getattr(base, "weight", None))
    return ranks, targets, dropouts, dtypes, unknown, quantized


def _config_warnings(config) -> None:
    for key, what in (("use_dora", "DoRA's magnitude vectors"),
                      ("modules_to_save", "the trainable copies of modules_to_save"),
                      ("trainable_token_indices", "trainable token rows")):
        if getattr(config, key, None):
            warnings.warn(f"PEFT: {what} ({key}) are not estimated", PeftWarning, stacklevel=5)


def lora_knobs(model) -> dict:
    """The knobs a PEFT model's LoRA layers say (finetune, lora_rank, lora_targets,
    lora_dropout, lora_dtype); ValueError for a PEFT method other than LoRA."""
    layers = _lora_layers(model)
    config = next(iter(model.peft_config.values()))
    kind = str(getattr(getattr(config, "peft_type", None), "value", "LORA"))
    if not layers or kind != "LORA":
        raise ValueError(f"model: a PEFT model of type {kind} without LoRA layers; vramscope "
                         "estimates LoRA and QLoRA adapters")
    adapter = _active_adapter(model, layers)
    config = model.peft_config.get(adapter, config)
    _config_warnings(config)
    ranks, targets, dropouts, dtypes, unknown, quantized = _adapter_facts(layers, adapter)
    if not ranks:
        raise ValueError(f"model: no LoRA layer holds the active adapter {adapter!r}")
    if len(ranks) > 1:
        warnings.warn(f"PEFT: the layers have ranks {sorted(ranks)} (rank_pattern); the "
                      f"estimate gives every target rank {max(ranks)}", PeftWarning, stacklevel=3)
    if unknown:
        warnings.warn(f"PEFT: {len(unknown)} adapted layers have no --lora-targets name "
                      f"(first: {unknown[0]}); they are left out", PeftWarning, stacklevel=3)
    knobs = {"finetune": "qlora" if quantized else "lora", "lora_rank": max(ranks),
             "lora_targets": ",".join(t for t in _TARGET_ORDER if t in targets),
             "lora_dropout": max(dropouts)}
    base_dtype = weights_dtype(base_parameters(model))
    if dtypes and dtypes != {"float32"}:
        # PEFT upcasts 16-bit adapters to fp32 (autocast_adapter_dtype=True, peft_model.py);
        # adapters left in the base's dtype are --lora-dtype model.
        if dtypes != {base_dtype}:
            warnings.warn(f"PEFT: adapters in {', '.join(sorted(dtypes))} over {base_dtype} "
                          "weights; estimated in the weights' dtype", PeftWarning, stacklevel=3)
        knobs["lora_dtype"] = "model"
    return knobs


def warn_if_trainable_differs(model, report) -> None:
    """A PEFT model whose trainable parameters the estimate does not count the same (targets
    on some layers only, a regular expression's picks, trained biases): say so."""
    if not is_peft(model) or report.knobs.get("finetune") not in ("lora", "qlora"):
        return
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    estimated = (report.model or {}).get("trainable_parameters")
    if estimated is not None and trainable != estimated:
        warnings.warn(f"PEFT: the model trains {trainable:,} parameters, the estimate "
                      f"{estimated:,} (lora_targets={report.knobs.get('lora_targets')}); the "
                      "adapters differ from what the knobs express", PeftWarning, stacklevel=3)


def weights_dtype(named_params) -> str:
    """The dtype most of the floating weights are in (4-bit weights: their own dtype)."""
    counts: dict[str, int] = {}
    for _, param in named_params:
        name = dtype_name(param)
        if name.startswith(("float", "bfloat")):
            numel = 1
            for d in stored_shape(param):
                numel *= d
            counts[name] = counts.get(name, 0) + numel
    return max(counts, key=counts.get) if counts else "float32"


def precision_of(named_params) -> str | None:
    """--precision for weights in their dtype: bf16 / fp16 weights train as --precision bf16
    / fp16; fp32 weights leave the choice (fp32 or autocast) to the knob's default."""
    return _PRECISION_OF_WEIGHTS.get(weights_dtype(named_params))
