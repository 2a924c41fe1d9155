"""One grid point's knobs, and how each maps onto `vramscope estimate` flags.

The same Point drives both sides: runner.py applies it to a real transformers model (or,
for the UNet families, unet.py to a diffusers UNet2DConditionModel) the way users do,
`estimate_args` gives the lowering the equivalent flags.
"""

import dataclasses

from .models import (FLUX_LATENT_SIDE, flux_text_len, UNET_FAMILIES, TEXT_ENCODERS, VAE_SCALE,
                     is_flux, is_unet, text_encoder_config_paths)

PRECISIONS = ("fp32", "bf16", "bf16-mixed")
FINETUNES = ("full", "lora", "qlora")
CKPTS = ("none", "full", "reentrant")
ATTNS = ("eager", "sdpa")
OPTIMIZERS = ("adamw-foreach", "adamw-fused", "adamw-forloop", "sgd")
# diffusers checkpoints with use_reentrant=False only and runs SDPA (AttnProcessor2_0) by
# default, so a UNet point takes ckpt "none" / "full" and attn "sdpa" only.
UNET_CKPTS = ("none", "full")
UNET_SEQ = 7  # text tokens of encoder_hidden_states
UNET_LORA_TARGETS = "q,k,v,o"  # to_q, to_k, to_v, to_out.0: diffusers' LoRA scripts
# LitGPT's fine-tuning step (vsref/litgpt_model.py): finetune_full's, finetune_lora's
# estimated with --impl litgpt, and finetune_lora's estimated with transformers' modules.
LITGPT_TRAINERS = ("litgpt-model", "litgpt-lora", "litgpt-lora-as-transformers")


@dataclasses.dataclass(frozen=True)
class Point:
    family: str
    tf: int = 5  # transformers major version: 5 (.venv/tf5) or 4 (.venv/tf4, 4.57)
    finetune: str = "full"
    ckpt: str = "none"
    attn: str = "eager"
    precision: str = "fp32"
    optimizer: str = "adamw-foreach"
    batch: int = 2
    seq: int = 64
    steps: int = 2
    lora_rank: int = 8
    lora_targets: str = "q,v"
    # The adapters' dropout (0: the points recorded before it was a knob). Its mask's size
    # does not depend on the random numbers, only its values.
    lora_dropout: float = 0.0
    gpus: int = 1  # > 1: that many real ranks over gloo (vsref/ranks.py), with `dist`
    # The data-parallel library of a multi-rank point (vsref/ranks.py DIST_MODES): "ddp",
    # "fsdp1", "fsdp2", "zero1", "zero2", "zero3".
    dist: str = ""
    # FSDP's sharding: "full" (FULL_SHARD / reshard after forward) or "grad-op"
    # (SHARD_GRAD_OP / reshard_after_forward=False).
    fsdp: str = "full"
    # ZeRO offload: "optimizer" (offload_optimizer) or "params" (offload_param too).
    dist_offload: str = ""
    # ZeRO-3: the model built inside deepspeed.zero.Init (what the HF Trainer does).
    zero_init: bool = True
    # Bucket sizes: "" the usual ones (DDP's 25 MB; ZeRO: transformers' "auto" values),
    # "small" (DDP 1 MB; ZeRO 50,000 elements), "default" (DeepSpeed's own 5e8).
    dist_buckets: str = ""
    bucket_view: bool = False  # DDP gradient_as_bucket_view
    # ZeRO overlap_comm: "" DeepSpeed's default for the stage (on for 3, off for 1-2),
    # "on" or "off".
    overlap_comm: str = ""
    # FSDP wrapped by "accelerate" (Accelerator.prepare with the FSDP plugin the HF Trainer
    # builds, PEFT's wrap policy for adapters as the Trainer sets it) or "" (the library's
    # own wrapper on each decoder layer, then the root).
    launcher: str = ""
    # "plain": the model's own loss; "trl-sft": TRL 1.16's SFTTrainer step (its fused LM
    # head, runner.py step_loss), estimated with --loss trl-fused; "trl-dpo": DPOTrainer's
    # _compute_loss over `batch` preference pairs, estimated with --loss trl-fused --dpo.
    trainer: str = "plain"
    # Padding-free packing: the batch's rows flattened into one with position_ids
    # (transformers' DataCollatorWithFlattening, or TRL's padding_free collator for
    # trl-sft), estimated with --packing.
    packed: bool = False
    # torchtune's OffloadActivations around the model's forward (torchtune-model points
    # only; vsref/torchtune_model.py), estimated with --activation-offload.
    offload: bool = False
    # T5 (seq2seq): the labels' length, decoder tokens (0: seq, the source length),
    # estimated with --target-len.
    target_len: int = 0
    # A UNet or FLUX point's frozen VAE (models.VAE_FAMILIES; vsref/vae.py), estimated with
    # --vae; "": latents precomputed, as in the plain points.
    vae: str = ""

    def name(self):
        parts = [self.family, f"tf{self.tf}", self.finetune, f"ckpt-{self.ckpt}", self.attn,
                 self.precision, self.optimizer]
        if (self.batch, self.seq) != self._default_shape():
            parts.append(f"b{self.batch}s{self.seq}")
        if self.gpus > 1:
            parts += self._dist_name_parts()
        if self.trainer != "plain":
            parts.append(self.trainer)
        if self.packed:
            parts.append("packed")
        if self.offload:
            parts.append("offload")
        if self.target_len:
            parts.append(f"tgt{self.target_len}")
        if self.vae:
            parts.append(self.vae)
        if self.lora_dropout:
            parts.append(f"drop{self.lora_dropout:g}")
        if self.finetune != "full" and self.lora_targets not in ("q,v", "q,k,v,o"):
            # The adapters of the points recorded before other sets: q and v (CLIP, the
            # UNets and FLUX: q, k, v, o).
            parts.append("lora-" + self.lora_targets.replace(",", "+"))
        return "/".join(parts)

    def _dist_name_parts(self):
        parts = [f"{self.dist}x{self.gpus}"]
        if self.fsdp != "full":
            parts.append(self.fsdp)
        if self.dist_offload:
            parts.append(f"offload-{self.dist_offload}")
        if not self.zero_init:
            parts.append("no-zero-init")
        if self.dist_buckets:
            parts.append(f"buckets-{self.dist_buckets}")
        if self.bucket_view:
            parts.append("bucket-view")
        if self.overlap_comm:
            parts.append(f"overlap-{self.overlap_comm}")
        if self.launcher:
            parts.append(self.launcher)
        return parts

    def dist_estimate_args(self):
        """The parallel flags of a multi-rank point."""
        args = ["--gpus", str(self.gpus)]
        if self.dist == "ddp":
            args.append("--ddp")
            if self.dist_buckets == "small":
                args += ["--ddp-bucket-cap-mb", "1"]
            if self.bucket_view:
                args.append("--gradient-as-bucket-view")
        elif self.dist.startswith("fsdp"):
            args += ["--fsdp", self.fsdp, "--fsdp-version", self.dist[-1]]
            if not self.launcher:
                # The library's own wrapper (ranks.py): FSDP1's default backward_prefetch
                # is BACKWARD_PRE; FSDP2 wraps each layer whatever the adapters.
                args += (["--fsdp-backward-prefetch", "pre"] if self.dist == "fsdp1"
                         else ["--fsdp-wrap", "layers"])
        else:
            args += ["--zero", self.dist[-1]]
            if self.dist_buckets == "small":
                args += ["--zero-reduce-bucket-size", "50000", "--zero-prefetch-bucket-size",
                         "50000", "--zero-persistence-threshold", "0"]
            elif not self.dist_buckets:
                args += ["--zero-buckets", "hf-auto"]
            if not self.zero_init:
                args.append("--no-zero-init")
            if self.overlap_comm:
                args += ["--zero-overlap-comm", self.overlap_comm]
        if self.dist_offload:
            args += ["--offload", self.dist_offload]
        return args

    def _default_shape(self):
        # A UNet or FLUX point's `seq` is its text length (encoder_hidden_states).
        if is_flux(self.family):
            return (2, flux_text_len(self.family))
        return (2, UNET_SEQ) if is_unet(self.family) else (2, 64)

    def transformers_version(self):
        return "5.24" if self.tf == 5 else "4.57"

    def estimate_args(self):
        """The `vramscope estimate` flags of this point (model path not included)."""
        if is_unet(self.family) or is_flux(self.family):
            return self._unet_estimate_args()
        args = ["--batch", str(self.batch), "--seq", str(self.seq), "--steps", str(self.steps),
                "--precision", self.precision, "--optimizer", self.optimizer,
                "--finetune", self.finetune, "--grad-ckpt", self.ckpt, "--attn", self.attn,
                "--transformers-version", self.transformers_version(),
                # runner.py calls model(input_ids=..., labels=...) without a mask.
                "--no-attention-mask"]
        if self.family == "clip":
            # CLIPModel's text tower reads --text-len tokens (--seq is not read).
            args += ["--text-len", str(self.seq)]
        if self.gpus > 1:
            args += self.dist_estimate_args()
        if self.packed:
            args.append("--packing")
        if self.target_len:
            args += ["--target-len", str(self.target_len)]
        if self.trainer in ("trl-sft", "trl-dpo"):
            args += ["--loss", "trl-fused"]
        # torchtune-model-as-transformers: the same reference, estimated with
        # transformers' modules (what --impl torchtune changes).
        tt_model = self.trainer in ("torchtune-model", "torchtune-model-as-transformers")
        if self.trainer == "torchtune" or tt_model:
            args += ["--loss", "torchtune-chunked"]
        if self.trainer == "torchtune-model":
            args += ["--impl", "torchtune"]
        if self.offload:
            args.append("--activation-offload")
        # LitGPT's GPT and finetune/*.py's chunked lm_head and chunked_cross_entropy;
        # litgpt-lora-as-transformers: its LoRA estimated with transformers' and PEFT's
        # modules (what --impl litgpt changes).
        litgpt = self.trainer in LITGPT_TRAINERS
        if litgpt:
            args += ["--loss", "litgpt-chunked"]
        if self.trainer in ("litgpt-model", "litgpt-lora"):
            args += ["--impl", "litgpt"]
        if (tt_model or litgpt) and self.finetune != "full":
            args += ["--lora-dtype", "model"]
        if self.trainer == "trl-dpo":
            # DataCollatorForPreference's batch carries an attention_mask (all ones here).
            args = [a for a in args if a != "--no-attention-mask"] + ["--dpo"]
        if self.finetune != "full":
            args += ["--lora-rank", str(self.lora_rank), "--lora-targets", self.lora_targets,
                     "--lora-dropout", f"{self.lora_dropout:g}"]
        return args

    def _unet_estimate_args(self):
        # No --transformers-version (diffusers runs the model) and no --no-attention-mask
        # (a UNet call has no attention mask); the point's seq is the text length.
        # A FLUX point's latents are FLUX_LATENT_SIDE square (vsref/flux.py), from an
        # image VAE_SCALE times larger.
        latent = (FLUX_LATENT_SIDE if is_flux(self.family)
                  else UNET_FAMILIES[self.family]["sample_size"])
        image_size = latent * VAE_SCALE
        args = ["--batch", str(self.batch), "--text-len", str(self.seq), "--image-size",
                str(image_size), "--steps", str(self.steps), "--precision", self.precision,
                "--optimizer", self.optimizer, "--finetune", self.finetune,
                "--grad-ckpt", self.ckpt, "--attn", self.attn]
        if self.finetune == "lora":
            args += ["--lora-rank", str(self.lora_rank), "--lora-targets", self.lora_targets,
                     "--lora-dropout", f"{self.lora_dropout:g}"]
        for path in text_encoder_config_paths(self.family) if self.family in TEXT_ENCODERS else []:
            args += ["--text-encoder", path]
        return args

    def to_json(self):
        d = dataclasses.asdict(self)
        # The points without a VAE or adapter dropout keep their recorded form.
        if not self.vae:
            d.pop("vae")
        if not self.lora_dropout:
            d.pop("lora_dropout")
        # Single-process points keep their recorded form (no multi-rank keys).
        if self.gpus == 1:
            for key in ("dist", "fsdp", "dist_offload", "zero_init", "dist_buckets",
                        "bucket_view", "launcher"):
                d.pop(key)
        # Points without an overlap_comm choice keep their recorded form.
        if not self.overlap_comm:
            d.pop("overlap_comm")
        return d


def point_from_json(d):
    return Point(**d)
