"""Runs one grid point with the real libraries on CPU and records its trace.

Run inside one of the project's environments (.venv/tf5 or .venv/tf4):

    python -m vsref.runner JOBS.json

It builds the real transformers model from the config, applies the knobs the way users
do (attn_implementation, gradient_checkpointing_enable with use_reentrant, PEFT's
get_peft_model, a bf16 cast or torch.autocast, torch.optim with an explicit foreach /
fused choice), and runs `steps` training steps of the usual loop
(zero_grad(set_to_none=True), model(**batch, labels=...), loss.backward(), step) under
vramscope_trace, which writes every storage allocation and free. The diffusers UNet
families run through vsref/unet.py instead, with diffusers' own training-script knobs.
"""

import json
import os
import sys
import tempfile

import torch
import transformers
import vramscope_trace

from .knobs import LITGPT_TRAINERS, point_from_json
from .models import is_flux, is_unet

# The target modules of the lowering's --lora-targets names, per family (PEFT's
# target_modules match module-name suffixes).
_LORA_MODULES = {
    "q": ("q_proj", "query", "c_attn", "query_key_value", "Wqkv", "qkv_proj"),
    "v": ("v_proj", "value"),
    # CLIP's points target all four attention projections (k_proj, out_proj).
    "k": ("k_proj",),
    "o": ("out_proj", "o_proj"),
    "gate": ("gate_proj",),
    "up": ("up_proj",),
    "down": ("down_proj",),
}


def build_model(point, config_dict):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config_dict, f)
        config = transformers.AutoConfig.from_pretrained(d)
    dtype = torch.bfloat16 if point.precision == "bf16" else torch.float32
    if config.architectures and config.architectures[0].endswith("ForSequenceClassification"):
        auto = transformers.AutoModelForSequenceClassification
    elif config.architectures and config.architectures[0].endswith("ForTokenClassification"):
        auto = transformers.AutoModelForTokenClassification
    elif config.model_type == "bert":
        auto = transformers.AutoModelForMaskedLM
    elif config.model_type == "vit":
        auto = transformers.AutoModelForImageClassification
    elif config.model_type == "t5":
        auto = transformers.AutoModelForSeq2SeqLM  # T5ForConditionalGeneration
    elif config.model_type == "clip":
        auto = transformers.AutoModel  # CLIPModel
    else:
        auto = transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    model = auto.from_config(config, attn_implementation=point.attn)
    if point.finetune == "qlora":
        return load_in_4bit(point, auto, model.to(dtype), dtype)
    return model.to(dtype)


def load_in_4bit(point, auto, model, dtype):
    """QLoRA's model, as its scripts load one: from_pretrained with bitsandbytes' NF4 and
    double quantization, its compute dtype the training's 16-bit dtype (fp32 for fp32),
    here on bitsandbytes' CPU backend (0.50: the same Params4bit storage and QuantState as
    on CUDA, and gemm_4bit's dequantize-then-linear path)."""
    compute = torch.float32 if point.precision == "fp32" else torch.bfloat16
    quantization = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        return auto.from_pretrained(d, quantization_config=quantization, device_map="cpu",
                                    dtype=dtype, attn_implementation=point.attn)


def quant_state_tensors(model):
    """The QuantState tensors of every Params4bit (absmax, the nested absmax and code,
    the offset, the NF4 code): made by the load, so setup allocations of the trace."""
    seen, out = set(), []
    for p in model.parameters():
        state = getattr(p, "quant_state", None)
        if state is None:
            continue
        nested = getattr(state, "state2", None) if state.nested else None
        for t in (state.absmax, state.code, state.offset,
                  nested.absmax if nested else None, nested.code if nested else None):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                out.append(t)
    return out


def apply_knobs(point, model):
    if point.finetune == "qlora":
        import peft

        # The usual QLoRA order: prepare_model_for_kbit_training (peft 0.21.2: freezes the
        # base, casts every 16-bit non-Params4bit parameter to fp32 and, with checkpointing,
        # calls enable_input_require_grads since no use_reentrant is given), then the
        # trainer's gradient_checkpointing_enable with its own kwargs.
        model = peft.prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=point.ckpt != "none")
    if point.ckpt != "none":
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": point.ckpt == "reentrant"})
    if point.finetune in ("lora", "qlora"):
        import peft

        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        targets = sorted(t for key in point.lora_targets.split(",")
                         for t in _LORA_MODULES[key] if t in names)
        if model.config.model_type == "t5":
            # T5Attention's q / k / v / o (PEFT's default targets for t5 are q and v).
            targets = point.lora_targets.split(",")
        config = peft.LoraConfig(r=point.lora_rank, lora_alpha=2 * point.lora_rank,
                                 lora_dropout=point.lora_dropout, target_modules=targets)
        # Checkpointing is on before the adapters are attached (the usual order), so
        # PeftModel.__init__ calls enable_input_require_grads itself.
        model = peft.get_peft_model(model, config)
    model.train()
    return model


def make_optimizer(point, model):
    params = [p for p in model.parameters() if p.requires_grad]
    if point.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    kind = {"adamw-foreach": {"foreach": True}, "adamw-fused": {"fused": True},
            "adamw-forloop": {"foreach": False}}[point.optimizer]
    return torch.optim.AdamW(params, lr=1e-4, **kind)


def packed_batch(point, config):
    """`point.batch` sequences of `point.seq` tokens through a padding-free collator: TRL's
    (DataCollatorForLanguageModeling(padding_free=True), trl 1.16.0) for trl-sft, else
    transformers' DataCollatorWithFlattening: one row, position_ids restarting per sequence,
    the first label of each -100."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, config.vocab_size, (point.batch, point.seq), generator=g)
    examples = [{"input_ids": row.tolist()} for row in ids]
    if point.trainer == "trl-sft":
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        return DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(examples)
    return transformers.DataCollatorWithFlattening()(examples)


def make_batch(point, config):
    if point.packed:
        return packed_batch(point, config)
    g = torch.Generator().manual_seed(1)
    if config.model_type == "vit":
        # An image processor's fp32 pixel_values and one class per image.
        side = config.image_size
        return {"pixel_values": torch.randn(point.batch, config.num_channels, side, side,
                                            generator=g),
                "labels": torch.randint(0, config.num_labels, (point.batch,), generator=g)}
    if config.model_type == "clip":
        # A CLIPProcessor's batch: ids padded to --text-len, fp32 pixel_values; CLIPModel's
        # contrastive loss is asked for with return_loss.
        side = config.vision_config.image_size
        return {"input_ids": torch.randint(2, config.text_config.vocab_size,
                                           (point.batch, point.seq), generator=g),
                "pixel_values": torch.randn(point.batch, config.vision_config.num_channels,
                                            side, side, generator=g),
                "return_loss": True}
    ids = torch.randint(2, config.vocab_size, (point.batch, point.seq), generator=g)
    if config.model_type == "t5":
        # Seq2seq: source ids and target labels (the model shifts them right itself).
        tgt = point.target_len or point.seq
        return {"input_ids": ids,
                "labels": torch.randint(2, config.vocab_size, (point.batch, tgt), generator=g)}
    if config.architectures and config.architectures[0].endswith("ForTokenClassification"):
        return {"input_ids": ids,
                "labels": torch.randint(0, config.num_labels, (point.batch, point.seq), generator=g)}
    if config.architectures and config.architectures[0].endswith("ForSequenceClassification"):
        # One label per sequence: a class index, or a float for regression (one label).
        if config.num_labels == 1:
            return {"input_ids": ids, "labels": torch.randn(point.batch, generator=g)}
        return {"input_ids": ids,
                "labels": torch.randint(0, config.num_labels, (point.batch,), generator=g)}
    return {"input_ids": ids, "labels": ids.clone()}


_TRL_OUTPUTS = {"trl-sft": ("log_probs", "entropy", "is_top1"),
                "trl-dpo": ("log_probs", "entropy", "mean_logits", "is_top1")}


def add_trl_head(point, model):
    """What SFTTrainer.__init__ / DPOTrainer.__init__ (trl 1.16.0) do to the model: TRL's
    fused LM head on the base model, with the outputs each trainer asks for."""
    if point.trainer not in _TRL_OUTPUTS:
        return model
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    if point.trainer == "trl-dpo":
        disable_dropout_in_model(model)  # DPOConfig.disable_dropout, default True
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    add_fused_lm_head(base, outputs=_TRL_OUTPUTS[point.trainer])
    return model


def dpo_reference(point, config_dict):
    """DPOTrainer's reference under full fine-tuning: the same model again, in the policy's
    dtype, dropout off, in eval mode (accelerator.prepare_model(evaluation_mode=True)), with
    the default fused head (log-probabilities only). Under PEFT there is none: the policy
    runs with its adapters disabled."""
    if point.trainer != "trl-dpo" or point.finetune != "full":
        return None
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    ref = build_model(point, config_dict)
    disable_dropout_in_model(ref)
    ref.eval()
    add_fused_lm_head(ref)
    return ref


class _OneProcess:
    """The accelerator calls DPOTrainer._compute_loss makes, for one CPU process."""

    device = torch.device("cpu")

    @staticmethod
    def unwrap_model(model):
        return model

    @staticmethod
    def gather_for_metrics(t):
        return t

    @staticmethod
    def gather(t):
        return t


def dpo_trainer_state(point, model, ref):
    """The DPOTrainer attributes _compute_loss reads, with DPOConfig's defaults (sigmoid
    loss, beta 0.1, no weighting, reference log-probabilities not precomputed)."""
    import collections
    import types

    ckpt = {"use_reentrant": point.ckpt == "reentrant"} if point.ckpt != "none" else None
    return types.SimpleNamespace(
        model=model, ref_model=ref, accelerator=_OneProcess(), aux_loss_enabled=False,
        ld_alpha=None, precompute_ref_logps=False,
        args=types.SimpleNamespace(gradient_checkpointing_kwargs=ckpt),
        f_divergence_type="reverse_kl", loss_types=["sigmoid"], loss_weights=[1.0], beta=0.1,
        use_weighting=False, label_smoothing=0.0,
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)),
        _total_train_tokens=0, _tp_size=1)


def dpo_batch(point, config):
    """DataCollatorForPreference's batch for `point.batch` pairs: chosen rows then rejected
    rows, every position a completion token (the lowering's assumption)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, config.vocab_size, (2 * point.batch, point.seq), generator=g)
    ones = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": ones, "completion_mask": ones.clone()}


def _torchtune_loss():
    """torchtune 0.6.1's CEWithChunkedOutputLoss, from its own file (the package's
    __init__ imports torchao, which the reference environment does not have)."""
    import importlib.util
    import pathlib

    import site

    for root in site.getsitepackages():
        path = pathlib.Path(root) / "torchtune" / "modules" / "loss" / "ce_chunked_output_loss.py"
        if path.exists():
            spec = importlib.util.spec_from_file_location("tt_ce_chunked_output_loss", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module.CEWithChunkedOutputLoss()
    raise RuntimeError("torchtune is not installed (requirements/reference-tf5-nodeps.txt)")


class ChunkedOutputModel(torch.nn.Module):
    """transformers' backbone with torchtune's TransformerDecoder.chunked_output (0.6.1
    modules/transformer.py): the final hidden states projected in 8 chunks, a list of logits.
    The module the training loop calls, so that the recorder's forward phase starts here."""

    def __init__(self, causal_lm):
        super().__init__()
        self.causal_lm = causal_lm
        self.config = causal_lm.config

    def forward(self, input_ids):
        # torchtune's decoder keeps no KV cache in training.
        hidden = self.causal_lm.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state
        return [self.causal_lm.lm_head(chunk) for chunk in hidden.tensor_split(8, dim=1)]


def torchtune_step_loss(model, batch):
    """A torchtune recipe's _loss_step (recipes/full_finetune_single_device.py, 0.6.1): the
    chunked output, the labels shifted with hstack, CEWithChunkedOutputLoss, `del logits`."""
    labels = batch["labels"]
    logits = model(batch["input_ids"])
    ignore = torch.full((labels.shape[0], 1), -100, dtype=labels.dtype)
    labels = torch.hstack((labels[..., 1:], ignore))
    loss = _torchtune_loss()(logits, labels)
    del logits
    return loss


def step_loss(point, model, batch, trainer_state=None):
    """One micro-batch's loss: the model's own (transformers' loss), or SFTTrainer.compute_loss's
    with TRL's fused head (trl 1.16.0: -log_probs summed over the label count, then the
    entropy and token-accuracy metrics read back with .item())."""
    if point.trainer == "trl-dpo":
        from trl import DPOTrainer

        return DPOTrainer._compute_loss(trainer_state, model, batch, return_outputs=False)
    if point.trainer == "torchtune":
        return torchtune_step_loss(model, batch)
    if point.trainer != "trl-sft":
        return model(**batch).loss
    outputs = model(**batch, use_cache=False, fused_lm_head=True)
    per_token_loss = -outputs.log_probs
    num_tokens = outputs.label_mask.sum()
    loss = per_token_loss.sum() / torch.as_tensor(num_tokens).clamp(min=1)
    num_valid = outputs.label_mask.sum()
    entropy_sum = outputs.entropy.detach().sum()
    num_correct = outputs.is_top1.sum()
    _ = ((entropy_sum / num_valid).item(), (num_correct / num_valid).item())
    return loss


def run(point, config_dict, out_path):
    if is_unet(point.family):
        from . import unet  # diffusers: .venv/tf5 only

        unet.run(point, config_dict, out_path)
        return
    if is_flux(point.family):
        from . import flux  # diffusers: .venv/tf5 only

        flux.run(point, config_dict, out_path)
        return
    if point.trainer in ("torchtune-model", "torchtune-model-as-transformers"):
        from . import torchtune_model  # torchtune's own modules: .venv/tf5 only

        torchtune_model.run_isolated(point, config_dict, out_path)
        return
    if point.trainer in LITGPT_TRAINERS:
        from . import litgpt_model  # LitGPT and lightning: .venv/litgpt, a child process

        litgpt_model.run_isolated(point, config_dict, out_path)
        return
    model = add_trl_head(point, apply_knobs(point, build_model(point, config_dict)))
    if point.trainer == "torchtune":
        model = ChunkedOutputModel(model)
    _train(point, model, out_path, dpo_reference(point, config_dict))


def _train(point, model, out_path, ref=None):
    optimizer = make_optimizer(point, model)
    dpo = point.trainer == "trl-dpo"
    batch = dpo_batch(point, model.config) if dpo else make_batch(point, model.config)
    state = dpo_trainer_state(point, model, ref) if dpo else None
    # The reference's weights exist before the step: adopted as setup allocations.
    existing = {"batch": batch, "reference": list(ref.parameters()) if ref is not None else [],
                "quant_state": quant_state_tensors(model)}
    autocast = point.precision == "bf16-mixed"
    meta = [("reference", point.name()), ("transformers", transformers.__version__),
            ("torch", torch.__version__)]
    # A ViT's or CLIP's batch (pixel_values) is made each step, as a data loader's, and
    # the loop variable holds it until the step is over.
    per_step = model.config.model_type in ("vit", "clip")
    if per_step:
        existing["batch"] = None
    with vramscope_trace.record(out_path, model=model, optimizer=optimizer, inputs=existing,
                                meta=meta):
        for _ in range(point.steps):
            if per_step:
                batch = make_batch(point, model.config)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = step_loss(point, model, batch, state)
            loss.backward()
            del loss
            optimizer.step()
            if per_step:
                del batch


def main(argv):
    """Runs every job of a jobs file: a JSON list of {"point", "config", "out"}; one process
    serves many points so that torch and transformers are imported once. A job that
    fails writes `out + ".error"` with the exception and the rest go on."""
    if len(argv) != 1:
        print("usage: python -m vsref.runner JOBS.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        jobs = json.load(f)
    torch.set_num_threads(1)
    for job in jobs:
        job["point"] = point_from_json(job["point"])
    ranked = [job for job in jobs if job["point"].gpus > 1]
    if ranked:
        from . import ranks  # real ranks over gloo, a spawn per rank count

        ranks.run_many(ranked)
    for job in jobs:
        if job["point"].gpus > 1:
            continue
        try:
            run(job["point"], job["config"], job["out"])
        except Exception as e:  # noqa: BLE001 - reported per point, the grid goes on
            with open(job["out"] + ".error", "w", encoding="utf-8") as f:
                f.write(f"{type(e).__name__}: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
