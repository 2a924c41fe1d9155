"""LitGPT 0.5.13's own GPT through its fine-tuning step, the reference of `--impl litgpt`
(in the full grid; `--grid litgpt-model` runs these points alone). The step is
litgpt/finetune/full.py's and lora.py's fit() (0.5.13) on one device: the model built under
fabric.init_module() and set up by a real lightning Fabric (bf16-true: bf16 weights, the
forward under torch's default dtype bf16; bf16-mixed: fp32 weights, the forward under
autocast; 32-true), `model.max_seq_length` set to the longest sequence (which rebuilds the
fp32 RoPE cache), `logits = model(input_ids, lm_head_chunk_size=128)`,
`logits[-1] = logits[-1][..., :-1, :]`, chunked_cross_entropy(logits, targets[..., 1:]),
fabric.backward, optimizer.step, optimizer.zero_grad; `logits` and `loss` are the loop's
variables, alive until the next iteration rebinds them. LoRA: litgpt.lora.GPT with
mark_only_lora_as_trainable (the adapters in the weights' dtype). Checkpointing: the
scripts enable it only through FSDPStrategy(activation_checkpointing_policy={Block}), whose
_setup_activation_checkpointing wraps each Block in torch's non-reentrant checkpoint_wrapper;
the same wrapper is applied here on one process.
LitGPT's package imports lightning and jsonargparse: they live in .venv/litgpt
(requirements/reference-litgpt.txt), on the path of a child process only.
"""

import json
import os
import sys

import torch
import vramscope_trace

from .isolated import run_in_child
from .knobs import point_from_json
from .runner import make_optimizer

EXTRA = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                      "..", ".venv", "litgpt"))
CHUNK_TOKENS = 128  # finetune/*.py: model(input_ids, lm_head_chunk_size=128)
FABRIC_PRECISION = {"fp32": "32-true", "bf16": "bf16-true", "bf16-mixed": "bf16-mixed"}


class MissingEnvironment(RuntimeError):
    """.venv/litgpt is not there: the points are skipped, not failed."""


def available():
    return os.path.isdir(EXTRA)


def run_isolated(point, config, out_path):
    """run() in a child interpreter with LitGPT's libraries on its path."""
    if not available():
        raise MissingEnvironment(f"{EXTRA} is missing: run scripts/python_env.sh")
    run_in_child("litgpt_model", EXTRA, point, config, out_path)


def litgpt_config(point, config):
    """A llama-style litgpt Config (RMSNorm, LLaMAMLP, full RoPE, no biases) of the HF-style
    reference config the estimate reads."""
    lora = {}
    if point.finetune == "lora":
        targets = set(point.lora_targets.split(","))
        lora = dict(lora_r=point.lora_rank, lora_alpha=2 * point.lora_rank,
                    lora_dropout=point.lora_dropout,
                    lora_query="q" in targets, lora_key="k" in targets,
                    lora_value="v" in targets, lora_projection="o" in targets,
                    lora_mlp={"gate", "up", "down"} <= targets,
                    lora_head="lm_head" in targets)
    from litgpt.lora import Config

    return Config(name="vsref-llama", block_size=config["max_position_embeddings"],
                  vocab_size=config["vocab_size"], padded_vocab_size=config["vocab_size"],
                  n_layer=config["num_hidden_layers"], n_head=config["num_attention_heads"],
                  n_embd=config["hidden_size"], n_query_groups=config["num_key_value_heads"],
                  rotary_percentage=1.0, parallel_residual=False, bias=False,
                  norm_class_name="RMSNorm", norm_eps=config["rms_norm_eps"],
                  mlp_class_name="LLaMAMLP", intermediate_size=config["intermediate_size"],
                  rope_base=int(config["rope_theta"]), **lora)


def build(point, config):
    import lightning as L

    fabric = L.Fabric(accelerator="cpu", devices=1, precision=FABRIC_PRECISION[point.precision])
    with fabric.init_module(empty_init=False):
        torch.manual_seed(0)
        if point.finetune == "lora":
            from litgpt.lora import GPT, mark_only_lora_as_trainable

            model = GPT(litgpt_config(point, config))
            mark_only_lora_as_trainable(model)
        else:
            from litgpt.model import GPT

            model = GPT(litgpt_config(point, config))
    if point.ckpt != "none":
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing)

        from litgpt.model import Block

        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
    return fabric, model


def run(point, config, out_path):
    from litgpt.utils import chunked_cross_entropy

    fabric, model = build(point, config)
    wrapped = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(make_optimizer(point, model))
    # fit(): the longest sequence of the data set (every row `seq` long here).
    model.max_seq_length = min(point.seq, model.config.block_size)
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(2, config["vocab_size"], (point.batch, point.seq), generator=g)
    targets = input_ids.clone()
    meta = [("reference", point.name()), ("torch", torch.__version__)]
    with vramscope_trace.record(out_path, model=model, optimizer=optimizer,
                                inputs={"batch": [input_ids, targets]}, meta=meta):
        for _ in range(point.steps):
            logits = wrapped(input_ids, lm_head_chunk_size=CHUNK_TOKENS)
            logits[-1] = logits[-1][..., :-1, :]
            loss = chunked_cross_entropy(logits, targets[..., 1:])
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        del logits, loss


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        job = json.load(f)
    run(point_from_json(job["point"]), job["config"], job["out"])
