"""torchtune 0.6.1's own decoder through a recipe's step, the reference of `--impl torchtune`
(in the full grid; `--grid torchtune-model` runs these points alone). The step is
recipes/lora_finetune_single_device.py's and full_finetune_single_device.py's (0.6.1):
the model built under training.set_default_dtype(dtype) (bf16 weights, no autocast),
LoRA adapters in that dtype with only they trainable (set_trainable_params),
set_activation_checkpointing over TransformerSelfAttentionLayer, set_num_output_chunks(8),
CEWithChunkedOutputLoss over labels shifted with hstack, `del logits` before backward.
torchtune's package imports torchao, omegaconf and its tokenizers' libraries: they live in
.venv/tf5-torchtune (requirements/reference-tf5-torchtune.txt), on the path of a child
process only, because PEFT refuses to build LoRA layers beside that torchao.
"""

import contextlib
import json
import os
import sys

import torch
import vramscope_trace

from .isolated import run_in_child
from .knobs import point_from_json
from .runner import make_optimizer

EXTRA = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                      "..", ".venv", "tf5-torchtune"))


def run_isolated(point, config, out_path):
    """run() in a child interpreter with torchtune's libraries on its path."""
    if not os.path.isdir(EXTRA):
        raise RuntimeError(f"{EXTRA} is missing: run scripts/python_env.sh")
    run_in_child("torchtune_model", EXTRA, point, config, out_path)


def _builders(config):
    """The family's (full, LoRA) component builders and their keyword arguments."""
    kw = dict(vocab_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
              num_heads=config["num_attention_heads"],
              num_kv_heads=config["num_key_value_heads"], embed_dim=config["hidden_size"],
              max_seq_len=config["max_position_embeddings"],
              intermediate_dim=config["intermediate_size"], norm_eps=config["rms_norm_eps"],
              rope_base=config["rope_theta"])
    if config["model_type"] == "qwen2":
        from torchtune.models.qwen2 import _component_builders as qwen2

        kw["tie_word_embeddings"] = config.get("tie_word_embeddings", False)
        return qwen2.qwen2, qwen2.lora_qwen2, kw
    from torchtune.models.llama3_2 import _component_builders as llama3_2

    kw["scale_factor"] = 32
    return llama3_2.llama3_2, llama3_2.lora_llama3_2, kw


def build(point, config):
    from torchtune import training

    full_builder, lora_builder, kw = _builders(config)
    dtype = torch.bfloat16 if point.precision == "bf16" else torch.float32
    with training.set_default_dtype(dtype):
        torch.manual_seed(0)
        if point.finetune == "lora":
            from torchtune.modules.peft import get_adapter_params, set_trainable_params

            names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "output_proj"}
            modules = [names[t] for t in point.lora_targets.split(",")]
            model = lora_builder(lora_attn_modules=modules, lora_rank=point.lora_rank,
                                 lora_alpha=2 * point.lora_rank, **kw)
            set_trainable_params(model, get_adapter_params(model))
        else:
            model = full_builder(**kw)
    if point.ckpt != "none":
        from torchtune import modules

        training.set_activation_checkpointing(
            model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
    return model


def offloading(point, model):
    """The recipes' activations_handling_ctx (0.6.1: training.get_act_offloading_ctx_manager,
    entered around `self._model(**batch)` only): OffloadActivations with the output head under
    a NoOpManager, run across vsref/device_boundary.py's CPU stand-in for the device."""
    if not point.offload:
        return contextlib.nullcontext()
    from torchtune import training

    return training.get_act_offloading_ctx_manager(model, True)


def run(point, config, out_path):
    from .device_boundary import cpu_device_boundary

    with cpu_device_boundary():
        _run(point, config, out_path)


def _run(point, config, out_path):
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    model = build(point, config)
    loss_fn = CEWithChunkedOutputLoss()
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    offload_ctx = offloading(point, model)
    optimizer = make_optimizer(point, model)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(2, config["vocab_size"], (point.batch, point.seq), generator=g)
    labels = tokens.clone()
    meta = [("reference", point.name()), ("torch", torch.__version__)]
    with vramscope_trace.record(out_path, model=model, optimizer=optimizer,
                                inputs={"batch": [tokens, labels]}, meta=meta):
        for _ in range(point.steps):
            optimizer.zero_grad(set_to_none=True)
            with offload_ctx:
                logits = model(tokens)
            ignore = torch.full((labels.shape[0], 1), -100, dtype=labels.dtype)
            loss = loss_fn(logits, torch.hstack((labels[..., 1:], ignore)))
            del logits
            loss.backward()
            del loss
            optimizer.step()


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    run(point_from_json(job["point"]), job["config"], job["out"])
