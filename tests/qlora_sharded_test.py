"""QLoRA over FSDP shards the packed 4-bit storage (issue 17, item 1) and keeps the other
weights in 16 bits (issue 18: TRL never calls prepare_model_for_kbit_training for
sharded QLoRA).

Hand derivation for llama-2-7b (data/models/llama-2-7b.json: hidden 4096, intermediate
11008, 32 layers, vocabulary 32000, untied head): bitsandbytes NF4 with double
quantization stores n/2 bytes of codes, one 8-bit absmax per 64 values and one fp32
absmax per 256 of those; embeddings, head and norms stay bf16 (the quant storage dtype).
"""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
MiB = 1 << 20


def packed(n):
    blocks = (n + 63) // 64
    return n // 2 + blocks + (blocks + 255) // 256 * 4


LINEAR = [4096 * 4096] * 4 + [4096 * 11008] * 3           # q, k, v, o; gate, up, down
WEIGHTS_4BIT = 32 * sum(packed(n) for n in LINEAR)
WEIGHTS_BF16 = (2 * 32000 * 4096 + 65 * 4096) * 2          # embed, lm_head, 65 RMSNorms
ADAPTERS_FP32 = 32 * 2 * 16 * (4096 + 4096) * 4            # rank 16 on q and v


def estimate(*args):
    p = subprocess.run([BIN, "estimate", "llama-2-7b", "--finetune", "qlora", *args, "--json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_fsdp_qlora_holds_a_share_of_the_packed_weights(gpus):
    r = estimate("--gpus", str(gpus), "--fsdp", "full")
    setup = next(ph for ph in r["phases"] if ph["phase"] == "setup")["peak_allocated_bytes"]
    share = (WEIGHTS_4BIT + WEIGHTS_BF16 + ADAPTERS_FP32) / gpus
    # Plus what is not sharded (buffers, padding of the flat shards): small.
    assert share <= setup <= share + 128 * MiB, (setup, share)
    # Sharded as 2-byte values it would be about 1.7 times as much.
    assert setup < 0.7 * (32 * sum(LINEAR) * 2 + WEIGHTS_BF16) / gpus


def test_fsdp_qlora_keeps_a_16_bit_residual_stream():
    # prepare_model_for_kbit_training (one GPU) makes the residual stream fp32; sharded
    # QLoRA does not, so no per-layer fp32 attention fallback appears.
    r = estimate("--gpus", "2", "--fsdp", "full", "--top", "50")
    ops = {a["op"] for a in r["top_allocations"]}
    assert "aten::_safe_softmax" not in ops, ops


def test_qlora_says_why_moe_experts_stay_unquantized_in_transformers_5():
    # transformers 5.24 replace_with_bnb_linear swaps nn.Linear / Conv1D only; 5.x
    # stacks the experts into 3-D parameters, 4.57 keeps one nn.Linear per expert.
    def notes(version):
        p = subprocess.run([BIN, "estimate", "mixtral-8x7b", "--finetune", "qlora", "--transformers-version",
                            version, "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert p.returncode == 0, p.stderr
        return " ".join(json.loads(p.stdout)["notes"])
    assert "does not quantize this model's experts" in notes("5.23")
    assert "does not quantize" not in notes("4.57")
