"""The MODEL argument: a name the engine resolves, or a Python object.

A catalog alias, a Hugging Face id, a config.json path or a model directory
(str or os.PathLike) goes to the engine as it is, as on the command line.

A transformers `PretrainedConfig`, or an `nn.Module` (typically built on the
meta device: no memory, no weights) becomes an in-memory model directory that
the engine reads like one on disk: config.json (`config.to_json_string()`) and,
for a module, a model.safetensors header listing every `named_parameters()`
entry with its exact name, shape and dtype (the data is never materialised:
the engine reads headers only). Nothing is written to disk. A PEFT model's
header is its base model's (vramscope._peft): each weight once, under its
checkpoint name, a 4-bit weight with its own shape.

A module also says knobs about itself (`object_knobs`): its weights' dtype
(--precision), a PEFT model's LoRA (vramscope._peft.lora_knobs), transformers'
gradient checkpointing and attention implementation. Knobs given win.
"""

from __future__ import annotations

import json
import os
import struct

from . import _peft
from ._knobs import path_arg

# torch dtype name -> safetensors dtype (the names the engine's reader knows).
_SAFETENSORS_DTYPES = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
    "int8": "I8", "uint8": "U8", "int16": "I16", "int32": "I32", "int64": "I64",
    "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "uint16": "U16", "uint32": "U32", "uint64": "U64",
}
_BITS = {"F32": 32, "F16": 16, "BF16": 16, "F64": 64, "I8": 8, "U8": 8, "I16": 16, "I32": 32,
         "I64": 64, "BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8, "U16": 16, "U32": 32, "U64": 64}

# Where the in-memory directories appear to the engine (and in reports).
_PREFIX = "<python>"


def resolve(model) -> tuple[str, dict]:
    """(the MODEL argument, in-memory files) for the engine's run_command."""
    if isinstance(model, (str, os.PathLike)):
        return path_arg(model, "model"), {}
    if _is_config(model):
        name = f"{_PREFIX}/config/{_config_name(model)}"
        return name, {f"{name}/config.json": _file(model.to_json_string(use_diff=False))}
    if _is_module(model):
        return _module_model(model)
    raise TypeError("model: expected a catalog alias, Hub id or path (str), a transformers "
                    f"PretrainedConfig or a torch.nn.Module, got {type(model).__name__}")


def _is_config(obj) -> bool:
    return hasattr(obj, "to_json_string") and hasattr(obj, "model_type")


def _is_module(obj) -> bool:
    return hasattr(obj, "named_parameters") and callable(obj.named_parameters)


def _config_name(config) -> str:
    name = getattr(config, "name_or_path", "") or getattr(config, "model_type", "") or "model"
    return name.strip("/").replace("..", "_")


def _file(text: str | bytes, size: int | None = None) -> tuple[bytes, int]:
    data = text.encode() if isinstance(text, str) else text
    return data, len(data) if size is None else size


def _named_weights(module):
    """(checkpoint name, parameter) of what the engine counts: a PEFT model's base."""
    if _peft.is_peft(module):
        return list(_peft.base_parameters(module))
    return list(module.named_parameters())


def _module_model(module) -> tuple[str, dict]:
    config = getattr(module, "config", None)
    if not _is_config(config):
        raise ValueError(f"model: a {type(module).__name__} without a transformers config "
                         "(.config); vramscope needs the architecture from a config")
    base = module.get_base_model() if _peft.is_peft(module) and \
        hasattr(module, "get_base_model") else module
    name = f"{_PREFIX}/module/{type(base).__name__}"
    header, size = safetensors_header(module)
    return name, {
        f"{name}/config.json": _file(config.to_json_string(use_diff=False)),
        f"{name}/model.safetensors": (header, size),
    }


# transformers >= 5 keeps a mixture-of-experts layer's experts stacked in two parameters,
# experts.gate_up_proj [E, 2I, H] (gate rows first) and experts.down_proj [E, H, I]; the
# checkpoints on the Hub, and the engine's parameter list, have one tensor per expert and
# projection (transformers converts when it loads). Per model_type: where the experts sit
# and their projections' names (gate, up, down).
_EXPERT_NAMES = {"mixtral": ("block_sparse_moe", ("w1", "w3", "w2"))}
_DEFAULT_EXPERT_NAMES = ("mlp", ("gate_proj", "up_proj", "down_proj"))


def _stored_tensors(name: str, shape: list[int], model_type: str):
    """(name, shape) of what a checkpoint stores for the parameter `name`."""
    prefix, _, leaf = name.rpartition(".")
    if model_type in _EXPERT_NAMES and name.endswith(".mlp.gate.weight"):  # the router
        return [(name[: -len("mlp.gate.weight")] + _EXPERT_NAMES[model_type][0] + ".gate.weight",
                 shape)]
    if not prefix.endswith(".experts") or leaf not in ("gate_up_proj", "down_proj") or \
            len(shape) != 3:
        return [(name, shape)]
    block, (gate, up, down) = _EXPERT_NAMES.get(model_type, _DEFAULT_EXPERT_NAMES)
    layer = prefix[: -len(".experts")].rpartition(".")[0]  # "model.layers.0"
    experts, rows, cols = shape
    out = []
    for e in range(experts):
        base = f"{layer}.{block}.experts.{e}."
        if leaf == "gate_up_proj":
            out += [(base + gate + ".weight", [rows // 2, cols]),
                    (base + up + ".weight", [rows // 2, cols])]
        else:
            out.append((base + down + ".weight", [rows, cols]))
    return out


def safetensors_header(module) -> tuple[bytes, int]:
    """The safetensors header of `module`'s parameters (as save_pretrained would store them,
    tied weights once; a PEFT model's base weights), and the size the whole file would have."""
    tensors, offset = {}, 0
    model_type = getattr(getattr(module, "config", None), "model_type", "")
    for name, param in _named_weights(module):
        dtype = _SAFETENSORS_DTYPES.get(_peft.dtype_name(param))
        if dtype is None:
            raise ValueError(f"model: parameter {name} has dtype {param.dtype}, which "
                             "safetensors does not store")
        for stored, shape in _stored_tensors(name, _peft.stored_shape(param), model_type):
            numel = 1
            for d in shape:
                numel *= d
            nbytes = (numel * _BITS[dtype] + 7) // 8
            tensors[stored] = {"dtype": dtype, "shape": shape,
                               "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
    text = json.dumps(tensors, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned (safetensors convention)
    return struct.pack("<Q", len(text)) + text, 8 + len(text) + offset


# transformers' config._attn_implementation -> --attn.
_ATTN = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash"}


def attn_knob(module) -> str | None:
    """--attn for the attention implementation transformers picked for `module`."""
    return _ATTN.get(getattr(getattr(module, "config", None), "_attn_implementation", None))


def grad_ckpt_knob(module) -> str | None:
    """--grad-ckpt when transformers' activation checkpointing is on: each layer's
    `_gradient_checkpointing_func` is `partial(checkpoint, **kwargs)` (transformers 5.24.0
    modeling_utils.py `_activation_checkpointing_enable`; use_reentrant False unless asked,
    True before 5.0), so its keywords say which kind."""
    for m in module.modules() if hasattr(module, "modules") else ():
        if getattr(m, "gradient_checkpointing", False) is True:
            func = getattr(m, "_gradient_checkpointing_func", None)
            reentrant = getattr(func, "keywords", {}).get("use_reentrant")
            if reentrant is None:
                import transformers
                reentrant = int(transformers.__version__.split(".")[0]) < 5
            return "reentrant" if reentrant else "full"
    return None


def object_knobs(model) -> dict:
    """The knobs a model object says about itself (see the module's doc); {} for a name or
    a config. ValueError for a PEFT model that is not LoRA."""
    if not _is_module(model):
        return {}
    knobs = {}
    precision = _peft.precision_of(_named_weights(model))
    if precision is not None:
        knobs["precision"] = precision
    if _peft.is_peft(model):
        knobs.update(_peft.lora_knobs(model))
    for key, value in (("grad_ckpt", grad_ckpt_knob(model)), ("attn", attn_knob(model))):
        if value is not None:
            knobs[key] = value
    return knobs
