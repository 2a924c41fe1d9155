"""The fidelity grid: which points run in CI and which in the full grid.

The full grid covers every family x both transformers versions x a covering set of knob
combinations (each value of each knob appears, and the common pairs), not the whole
cartesian product, which would take hours on two cores for little more information.
QLoRA is not in the grid: bitsandbytes' 4-bit path needs CUDA kernels (docs/fidelity.md).
"""

import dataclasses
import os
import sys

from .knobs import UNET_LORA_TARGETS, UNET_SEQ, Point
from .models import FAMILIES, FLUX_FAMILIES, FLUX_TEXT_LEN, UNET_FAMILIES, flux_text_len, is_t5

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


# CLIP's LoRA points adapt all four attention projections (q_proj, k_proj, v_proj,
# out_proj).
CLIP_LORA_TARGETS = "q,k,v,o"


def _point(family, tf, combo):
    finetune, ckpt, attn, precision, optimizer = combo
    return Point(family, tf=tf, finetune=finetune, ckpt=ckpt, attn=attn, precision=precision,
                 optimizer=optimizer,
                 lora_targets=CLIP_LORA_TARGETS if family == "clip" else "q,v")


def _supported(point):
    # T5 is modelled for transformers 5.x with eager attention only (t5_points).
    if is_t5(point.family):
        return point.tf == 5 and point.attn == "eager"
    # transformers 5.x refuses attn_implementation="sdpa" for Gemma 2 (ValueError:
    # "does not support an attention implementation through ... scaled_dot_product_attention").
    if point.family == "gemma2" and point.tf == 5 and point.attn == "sdpa":
        return False
    # transformers 4.57.6's CLIPModel has no get_input_embeddings(), which PEFT calls to make
    # checkpointed inputs require grad: that run raises NotImplementedError (and vramscope
    # refuses it).
    return not (point.family == "clip" and point.tf == 4 and point.finetune == "lora"
                and point.ckpt != "none")


# FSDP2 over gloo, 2 ranks (fully_shard per decoder layer, then the root), against
# `estimate --gpus 2 --fsdp full --fsdp-version 2 --fsdp-wrap layers`: the first
# multi-rank points (part of --grid ranks). fp32 and bf16 weights: *-mixed precision is
# a MixedPrecisionPolicy the launcher chooses, covered by RANK_POINTS_ACCELERATE.
FSDP_COMBOS = (COMBOS[0], COMBOS[1], COMBOS[3])
FSDP_FAMILIES = ("llama", "gpt2")


def _fsdp_point(family, tf, combo):
    return dataclasses.replace(_point(family, tf, combo), gpus=2, dist="fsdp2")


def fsdp_points():
    return [_fsdp_point(family, tf, combo) for family in FSDP_FAMILIES for tf in (5, 4)
            for combo in FSDP_COMBOS if family == "llama" or combo is COMBOS[0]]


# The UNet families' (finetune, ckpt, precision, optimizer), attention always sdpa: every
# value of each knob that diffusers offers (ckpt none / full only, vsref/knobs.py), each
# finetune with and without checkpointing, and autocast with checkpointing (the recompute
# runs under autocast again).
UNET_COMBOS = (
    ("full", "none", "fp32", "adamw-foreach"),
    ("full", "full", "bf16", "adamw-fused"),
    ("full", "full", "bf16-mixed", "adamw-forloop"),
    ("lora", "none", "bf16-mixed", "adamw-foreach"),
    ("lora", "full", "fp32", "sgd"),
    ("lora", "none", "bf16", "adamw-fused"),
)


def _unet_point(family, combo):
    """A UNet point: diffusers is installed in .venv/tf5 only, so tf 5."""
    finetune, ckpt, precision, optimizer = combo
    return Point(family, tf=5, finetune=finetune, ckpt=ckpt, attn="sdpa", precision=precision,
                 optimizer=optimizer, seq=UNET_SEQ, lora_targets=UNET_LORA_TARGETS)


def unet_points():
    return [_unet_point(family, combo) for family in UNET_FAMILIES for combo in UNET_COMBOS]


# diffusers' FluxTransformer2DModel through train_dreambooth_(lora_)flux.py's step
# (vsref/flux.py): the UNet's knob set (diffusers checkpoints non-reentrantly and runs SDPA),
# full fine-tuning and LoRA on to_q / to_k / to_v / to_out.0, each with and without
# checkpointing, bf16 weights and accelerate's bf16 autocast.
FLUX_COMBOS = UNET_COMBOS


def flux_points():
    return [dataclasses.replace(_unet_point(family, combo), seq=flux_text_len(family))
            for family in FLUX_FAMILIES for combo in FLUX_COMBOS]


# The frozen AutoencoderKL encoding real pixels before the step (vsref/vae.py, `estimate
# --vae`): its weight_dtype is fp32 under fp32 and half otherwise, so fp32, bf16 and both
# bf16-mixed scripts (full keeps the UNet fp32, LoRA casts it), on the SD-1.5-like UNet
# and the FLUX transformer.
VAE_COMBOS = (UNET_COMBOS[0], UNET_COMBOS[1], UNET_COMBOS[2], UNET_COMBOS[3])


def vae_points():
    points = [dataclasses.replace(_unet_point("unet_sd15", combo), vae="vae_sd")
              for combo in VAE_COMBOS]
    points += [dataclasses.replace(_unet_point("flux_dev", combo), seq=FLUX_TEXT_LEN,
                                   vae="vae_flux") for combo in VAE_COMBOS]
    return points


# TRL 1.16's SFTTrainer step (its fused LM head; trl is installed in .venv/tf5 only): every
# combo on Llama, three on families with tied embeddings (gemma, gpt2) or another layout
# (qwen2), and one row per micro-batch (the shifted slice is then contiguous, no copy).
# Not gemma2 (its softcap's tanh temporaries on CPU are not modelled) nor phi (lm_head bias).
TRL_FAMILIES = ("qwen2", "gemma", "gpt2")


def trl_points():
    points = [dataclasses.replace(_point("llama", 5, combo), trainer="trl-sft") for combo in COMBOS]
    points += [dataclasses.replace(_point(family, 5, combo), trainer="trl-sft")
               for family in TRL_FAMILIES for combo in COMBOS[:3]]
    points.append(dataclasses.replace(_point("llama", 5, COMBOS[2]), trainer="trl-sft", batch=1))
    # DPOTrainer: every combo on Llama (full: a reference copy; LoRA: adapters disabled),
    # two on Qwen2 and GPT-2.
    points += [dataclasses.replace(_point("llama", 5, combo), trainer="trl-dpo") for combo in COMBOS]
    points += [dataclasses.replace(_point(family, 5, combo), trainer="trl-dpo")
               for family in ("qwen2", "gpt2") for combo in COMBOS[:3:2]]
    # torchtune's chunked output and CEWithChunkedOutputLoss (0.6.1) over the backbone.
    points += [dataclasses.replace(_point(family, 5, combo), trainer="torchtune")
               for family in ("llama", "qwen2") for combo in COMBOS[:3]]
    return points


# Padding-free packing (one row, position_ids): the attention knobs decide the mask
# (sdpa and eager build a block-diagonal one over the row in transformers >= 4.54), so
# both, on both transformers versions, full and LoRA; and TRL's padding-free SFT step.
PACKED_COMBOS = (COMBOS[0], COMBOS[1], COMBOS[2], COMBOS[3])


def packed_points():
    points = [dataclasses.replace(_point(family, tf, combo), packed=True)
              for family in ("llama", "qwen2") for tf in (5, 4) for combo in PACKED_COMBOS]
    points += [dataclasses.replace(_point("llama", 5, combo), trainer="trl-sft", packed=True)
               for combo in PACKED_COMBOS[:3]]
    return points


# One row per micro-batch with eager attention: torch.matmul's reshape of the q / k / v
# views is then a view, not a copy (vsref found this through the packed points).
BATCH1_FAMILIES = ("llama", "gpt2", "falcon", "phi", "bert", "mixtral")


def batch1_points():
    return [dataclasses.replace(_point(family, tf, combo), batch=1)
            for family in BATCH1_FAMILIES for tf in (5, 4) for combo in (COMBOS[0], COMBOS[3])]


# T5ForConditionalGeneration (both feed-forward variants): every combo with eager
# attention (the sdpa path is refused), transformers 5.24, and one point whose target
# length differs from the source's.
T5_FAMILIES = ("t5", "t5_v11")


def t5_points():
    points = [dataclasses.replace(_point(family, 5, combo), attn="eager")
              for family in T5_FAMILIES for combo in COMBOS]
    points += [dataclasses.replace(_point(family, 5, COMBOS[2]), attn="eager", target_len=24)
               for family in T5_FAMILIES]
    return points


def full_grid():
    points = [p for family in FAMILIES for tf in (5, 4) for combo in COMBOS
              if not is_t5(family) and _supported(p := _point(family, tf, combo))]
    return (points + unet_points() + flux_points() + vae_points() + trl_points()
            + packed_points() + batch1_points() + torchtune_model_points() + t5_points()
            + litgpt_model_points() + litgpt_lora_points() + lora_dropout_points()
            + qlora_points())


def ci_grid():
    """One point per family and transformers version, every combo on Llama, and the FLUX
    points (six small steps, the only check of that lowering)."""
    points = [p for family in FAMILIES for tf in (5, 4)
              if _supported(p := _point(family, tf, COMBOS[0]))]
    points += [_point("llama", 5, combo) for combo in COMBOS[1:]]
    return points + flux_points()


def torchtune_model_points():
    """torchtune's own decoder (vsref/torchtune_model.py), estimated with --impl torchtune:
    full and LoRA, fp32 and bf16 (the recipes' dtypes), with and without checkpointing,
    SDPA as torchtune's attention calls it. Two kv heads, a 256-position rotary cache.
    Llama 3.2's and Qwen2's builders; activation offloading over eight Llama layers."""
    combos = [("full", "none", "fp32"), ("full", "none", "bf16"), ("full", "full", "bf16"),
              ("lora", "none", "fp32"), ("lora", "none", "bf16"), ("lora", "full", "bf16")]
    points = [Point("llama_tt", tf=5, finetune=f, ckpt=c, attn="sdpa", precision=p,
                    optimizer="adamw-foreach", trainer="torchtune-model") for f, c, p in combos]
    # Qwen2's builders: its own rotary embeddings, q / k / v biases, tied embeddings.
    qwen = [("full", "none", "bf16"), ("full", "full", "fp32"), ("lora", "none", "fp32"),
            ("lora", "full", "bf16")]
    points += [Point("qwen2_tt", tf=5, finetune=f, ckpt=c, attn="sdpa", precision=p,
                     optimizer="adamw-foreach", trainer="torchtune-model") for f, c, p in qwen]
    # The recipes' enable_activation_offloading (needs checkpointing): eight layers, so that
    # OffloadActivations' forward stash of 5 lets the earlier layers' inputs go.
    offload = [("full", "bf16"), ("full", "fp32"), ("lora", "bf16"), ("lora", "fp32")]
    return points + [Point("llama_tt8", tf=5, finetune=f, ckpt="full", attn="sdpa", precision=p,
                           optimizer="adamw-foreach", trainer="torchtune-model", offload=True)
                     for f, p in offload]


def torchtune_model_as_transformers_points():
    """The torchtune-model references estimated with transformers' modules (no --impl):
    what --impl torchtune changes. Not gated: these are expected to be off."""
    return [dataclasses.replace(p, trainer="torchtune-model-as-transformers")
            for p in torchtune_model_points() if not p.offload]


def _litgpt_available():
    extra = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".venv",
                         "litgpt")
    if not os.path.isdir(extra):
        print(f"litgpt-model points skipped: {os.path.normpath(extra)} is missing "
              "(scripts/python_env.sh makes it)", file=sys.stderr)
    return os.path.isdir(extra)


def litgpt_model_points():
    """LitGPT's own GPT through finetune_full's step (vsref/litgpt_model.py), estimated with
    --impl litgpt --loss litgpt-chunked: the three Fabric precisions, with and without
    per-Block checkpointing; two rows of 256 tokens (two lm_head chunks of 128). Skipped, with
    a message, where .venv/litgpt (requirements/reference-litgpt.txt) was not made."""
    if not _litgpt_available():
        return []
    combos = [("none", "fp32"), ("none", "bf16"), ("none", "bf16-mixed"), ("full", "fp32"),
              ("full", "bf16"), ("full", "bf16-mixed")]
    return [Point("llama_lg", tf=5, finetune="full", ckpt=c, attn="sdpa", precision=p, seq=256,
                  optimizer="adamw-foreach", trainer="litgpt-model") for c, p in combos]


def litgpt_lora_points():
    """finetune_lora's step on LitGPT's GPT (litgpt.lora: LoRAQKVLinear over the fused qkv,
    LoRALinear elsewhere), estimated with --impl litgpt: the three precisions; LitGPT's
    default adapters (query and value: a grouped conv1d per query group, zero padding), one
    slice (key), all of q / k / v, projection, MLP and head; its default dropout 0.05; as
    many query groups as heads (llama_lg_mha: one grouped conv1d); one row (no copy of the
    rank-sized gradient)."""
    if not _litgpt_available():
        return []
    every = "q,k,v,o,gate,up,down,lm_head"
    combos = [("llama_lg", "none", "fp32", "q,v", 0.0, 2),
              ("llama_lg", "none", "bf16", "q,v", 0.0, 2),
              ("llama_lg", "none", "bf16-mixed", "q,v", 0.0, 2),
              ("llama_lg", "full", "bf16", "q,v", 0.0, 2),
              ("llama_lg", "none", "bf16", "q,v", 0.05, 2),
              ("llama_lg", "full", "bf16-mixed", "q,v", 0.05, 2),
              ("llama_lg", "none", "bf16", "k", 0.0, 2),
              ("llama_lg", "none", "bf16", every, 0.0, 2),
              ("llama_lg", "full", "bf16-mixed", every, 0.05, 2),
              ("llama_lg", "none", "bf16", "q,v", 0.0, 1),
              ("llama_lg_mha", "none", "bf16", "q,v", 0.0, 2),
              ("llama_lg_mha", "none", "fp32", "q,k,v", 0.05, 2)]
    return [Point(f, tf=5, finetune="lora", ckpt=c, attn="sdpa", precision=p, seq=256, batch=b,
                  optimizer="adamw-foreach", trainer="litgpt-lora", lora_targets=t,
                  lora_dropout=d)
            for f, c, p, t, d, b in combos]


def litgpt_lora_as_transformers_points():
    """finetune_lora's step on LitGPT's GPT estimated with transformers' and PEFT's modules
    and the LitGPT loss (no --impl litgpt). Not gated: the gap is what --impl litgpt closes."""
    if not _litgpt_available():
        return []
    combos = [("none", "fp32"), ("none", "bf16"), ("none", "bf16-mixed"), ("full", "bf16")]
    return [Point("llama_lg", tf=5, finetune="lora", ckpt=c, attn="sdpa", precision=p, seq=256,
                  optimizer="adamw-foreach", trainer="litgpt-lora-as-transformers")
            for c, p in combos]


def qlora_points():
    """QLoRA as its scripts run it (vsref/runner.py load_in_4bit): a model loaded in NF4 with
    double quantization by bitsandbytes 0.50's CPU backend, prepare_model_for_kbit_training,
    PEFT adapters, estimated with --finetune qlora: the three precisions, the two kinds of
    checkpointing, every linear layer adapted (transformers 5.24: .venv/tf4 has no
    bitsandbytes)."""
    every = "q,k,v,o,gate,up,down"
    combos = [("llama", 5, "none", "bf16-mixed", "q,v"), ("llama", 5, "none", "bf16", "q,v"),
              ("llama", 5, "none", "fp32", "q,v"), ("llama", 5, "full", "bf16-mixed", "q,v"),
              ("llama", 5, "reentrant", "bf16-mixed", "q,v"),
              ("llama", 5, "full", "bf16-mixed", every), ("qwen2", 5, "none", "bf16-mixed", every),
              ("mistral", 5, "full", "bf16", every)]
    return [Point(f, tf=tf, finetune="qlora", ckpt=c, attn="sdpa", precision=p, lora_targets=t,
                  lora_dropout=0.05) for f, tf, c, p, t in combos]


def lora_dropout_points():
    """PEFT adapters with dropout (LoraConfig(lora_dropout=...)): CPU dropout's mask, in
    the input's dtype, saved beside each adapter's input."""
    return [Point("llama", tf=5, finetune="lora", ckpt=c, attn="sdpa", precision=p,
                  lora_dropout=0.05) for c, p in (("none", "bf16-mixed"), ("full", "bf16"))] + [
        Point("qwen2", tf=4, finetune="lora", ckpt="none", attn="sdpa", precision="fp32",
              lora_dropout=0.1, lora_targets="q,k,v,o,gate,up,down")]


def _ranked(combo, gpus=2, family="llama", tf=5, **knobs):
    return dataclasses.replace(_point(family, tf, combo), gpus=gpus, **knobs)


# (combo, knobs) of the 2-rank points: every library, every value of its knobs (DDP
# buckets and bucket views; FSDP 1 and 2, full and LoRA, FULL_SHARD and SHARD_GRAD_OP;
# ZeRO stages 1-3 with and without offload, zero.Init, small and HF "auto" buckets), in
# fp32 and bf16 (DeepSpeed's "bf16" config: bf16 weights with fp32 master partitions).
# FSDP's *-mixed precision is a MixedPrecision policy chosen by the launcher (accelerate),
# not the plain wrapper these points run.
RANK_POINTS_2 = (
    (COMBOS[0], dict(dist="ddp")),
    (COMBOS[0], dict(dist="ddp", dist_buckets="small")),
    (COMBOS[0], dict(dist="ddp", dist_buckets="small", bucket_view=True)),
    (COMBOS[3], dict(dist="ddp")),
    (COMBOS[2], dict(dist="ddp")),
    (COMBOS[0], dict(dist="fsdp1")),
    (COMBOS[1], dict(dist="fsdp1")),
    (COMBOS[3], dict(dist="fsdp1")),
    (COMBOS[0], dict(dist="fsdp1", fsdp="grad-op")),
    (COMBOS[0], dict(dist="fsdp2", fsdp="grad-op")),
    (COMBOS[0], dict(dist="zero1")),
    (COMBOS[1], dict(dist="zero1")),
    (COMBOS[0], dict(dist="zero1", dist_offload="optimizer")),
    (COMBOS[0], dict(dist="zero2")),
    (COMBOS[1], dict(dist="zero2")),
    (COMBOS[0], dict(dist="zero2", dist_buckets="small")),
    (COMBOS[0], dict(dist="zero2", dist_offload="optimizer")),
    (COMBOS[3], dict(dist="zero2")),
    (COMBOS[0], dict(dist="zero3")),
    (COMBOS[1], dict(dist="zero3")),
    (COMBOS[0], dict(dist="zero3", zero_init=False)),
    (COMBOS[4], dict(dist="zero3", zero_init=False)),
    (COMBOS[0], dict(dist="zero3", dist_offload="optimizer")),
    (COMBOS[0], dict(dist="zero3", dist_offload="params")),
    (COMBOS[0], dict(dist="zero3", dist_buckets="small")),
    (COMBOS[3], dict(dist="zero3")),
    # overlap_comm against the stage's default: stages 1-2 keep two reduce buckets with it
    # (HF's ds_config_zero2.json sets it on); small buckets, so that the second one weighs.
    (COMBOS[0], dict(dist="zero1", overlap_comm="on", dist_buckets="small")),
    (COMBOS[1], dict(dist="zero2", overlap_comm="on", dist_buckets="small")),
    (COMBOS[0], dict(dist="zero3", overlap_comm="off")),
)
# FSDP through accelerate, as the HF Trainer configures it: accelerate's own unit layout
# (FSDP2: the input embedding and [final norm, lm_head] units of fsdp2_prepare_model), its
# MixedPrecision for bf16-mixed, and PEFT's wrap policy for adapters.
RANK_POINTS_ACCELERATE = (
    (COMBOS[0], dict(dist="fsdp1", launcher="accelerate")),
    (COMBOS[0], dict(dist="fsdp2", launcher="accelerate")),
    (COMBOS[6], dict(dist="fsdp1", launcher="accelerate")),
    (COMBOS[6], dict(dist="fsdp2", launcher="accelerate")),
    (COMBOS[2], dict(dist="fsdp1", launcher="accelerate")),
    (COMBOS[2], dict(dist="fsdp2", launcher="accelerate")),
    (COMBOS[3], dict(dist="fsdp1", launcher="accelerate")),
    (COMBOS[3], dict(dist="fsdp2", launcher="accelerate")),
)
# Untied input and output embeddings (Mistral's config): accelerate's FSDP2 gives the
# input embedding a unit of its own.
RANK_POINTS_ACCELERATE_UNTIED = (
    (COMBOS[0], dict(dist="fsdp2", launcher="accelerate")),
    (COMBOS[6], dict(dist="fsdp2", launcher="accelerate")),
    (COMBOS[0], dict(dist="fsdp1", launcher="accelerate")),
)
RANK_POINTS_4 = (
    (COMBOS[0], dict(dist="ddp")),
    (COMBOS[0], dict(dist="fsdp1")),
    (COMBOS[3], dict(dist="fsdp1")),
    (COMBOS[0], dict(dist="fsdp2")),
    (COMBOS[3], dict(dist="fsdp2")),
    (COMBOS[0], dict(dist="zero1")),
    (COMBOS[0], dict(dist="zero2")),
    (COMBOS[0], dict(dist="zero2", dist_offload="optimizer")),
    (COMBOS[0], dict(dist="zero3")),
    (COMBOS[1], dict(dist="zero3")),
    (COMBOS[0], dict(dist="zero3", zero_init=False)),
    (COMBOS[0], dict(dist="zero3", dist_offload="optimizer")),
)


def ranks_points():
    """The multi-rank points (vsref/ranks.py): real DDP / FSDP / DeepSpeed ZeRO ranks, 2 and
    4 of them, with the FSDP2 points of the older `fsdp` grid."""
    points = [_ranked(combo, 2, **knobs) for combo, knobs in RANK_POINTS_2]
    points += [_ranked(combo, 2, **knobs) for combo, knobs in RANK_POINTS_ACCELERATE]
    points += [_ranked(combo, 2, family="mistral", **knobs)
               for combo, knobs in RANK_POINTS_ACCELERATE_UNTIED]
    points += [_ranked(combo, 4, **knobs) for combo, knobs in RANK_POINTS_4]
    return points + fsdp_points()


GRIDS = {"ci": ci_grid, "full": full_grid, "fsdp": fsdp_points, "ranks": ranks_points,
         "litgpt-model": litgpt_model_points,
         "litgpt-lora": litgpt_lora_points,
         "qlora": qlora_points,
         "litgpt-lora-as-transformers": litgpt_lora_as_transformers_points,
         "torchtune-model": torchtune_model_points,
         "torchtune-model-as-transformers": torchtune_model_as_transformers_points}
