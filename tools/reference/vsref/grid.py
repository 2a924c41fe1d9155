"""The fidelity grid: which points run in CI and which in the full grid.

The full grid covers every family x both transformers versions x a covering set of knob
combinations (each value of each knob appears, and the common pairs), not the whole
cartesian product, which would take hours on two cores for little more information.
QLoRA is not in the grid: bitsandbytes' 4-bit path needs CUDA kernels (docs/fidelity.md).
"""

from .knobs import Point
from .models import FAMILIES

# (finetune, ckpt, attn, precision, optimizer): every value of every knob at least once.
COMBOS = (
    ("full", "none", "eager", "fp32", "adamw-foreach"),
    ("full", "full", "sdpa", "bf16", "adamw-fused"),
    ("lora", "none", "sdpa", "bf16-mixed", "adamw-foreach"),
    ("lora", "reentrant", "eager", "fp32", "adamw-forloop"),
    ("full", "reentrant", "sdpa", "fp32", "adamw-forloop"),
    ("lora", "full", "eager", "bf16", "adamw-fused"),
    ("full", "none", "sdpa", "bf16-mixed", "adamw-fused"),
    ("lora", "full", "sdpa", "fp32", "sgd"),
)


def _point(family, tf, combo):
    finetune, ckpt, attn, precision, optimizer = combo
    return Point(family, tf=tf, finetune=finetune, ckpt=ckpt, attn=attn, precision=precision,
                 optimizer=optimizer)


def _supported(point):
    # transformers 5.x refuses attn_implementation="sdpa" for Gemma 2 (ValueError:
    # "does not support an attention implementation through ... scaled_dot_product_attention").
    return not (point.family == "gemma2" and point.tf == 5 and point.attn == "sdpa")


def full_grid():
    return [p for family in FAMILIES for tf in (5, 4) for combo in COMBOS
            if _supported(p := _point(family, tf, combo))]


def ci_grid():
    """One point per family and transformers version, plus every combo on Llama."""
    points = [_point(family, tf, COMBOS[0]) for family in FAMILIES for tf in (5, 4)]
    points += [_point("llama", 5, combo) for combo in COMBOS[1:]]
    return points


GRIDS = {"ci": ci_grid, "full": full_grid}
