"""Runs one grid point with the real libraries on CPU and records its trace.

Run inside one of the project's environments (.venv/tf5 or .venv/tf4):

    python -m vsref.runner JOBS.json

It builds the real transformers model from the config, applies the knobs the way users
do (attn_implementation, gradient_checkpointing_enable with use_reentrant, PEFT's
get_peft_model, a bf16 cast or torch.autocast, torch.optim with an explicit foreach /
fused choice), and runs `steps` training steps of the usual loop
(zero_grad(set_to_none=True), model(**batch, labels=...), loss.backward(), step) under
vramscope_trace, which writes every storage allocation and free.
"""

import json
import os
import sys
import tempfile

import torch
import transformers
import vramscope_trace

from .knobs import point_from_json

# The target modules of the lowering's --lora-targets names, per family (PEFT's
# target_modules match module-name suffixes).
_LORA_MODULES = {
    "q": ("q_proj", "query", "c_attn", "query_key_value", "Wqkv", "qkv_proj"),
    "v": ("v_proj", "value"),
}


def build_model(point, config_dict):
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config_dict, f)
        config = transformers.AutoConfig.from_pretrained(d)
    dtype = torch.bfloat16 if point.precision == "bf16" else torch.float32
    auto = (transformers.AutoModelForMaskedLM if config.model_type == "bert"
            else transformers.AutoModelForCausalLM)
    torch.manual_seed(0)
    model = auto.from_config(config, attn_implementation=point.attn)
    return model.to(dtype)


def apply_knobs(point, model):
    if point.ckpt != "none":
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": point.ckpt == "reentrant"})
    if point.finetune == "lora":
        import peft

        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        targets = sorted(t for key in point.lora_targets.split(",")
                         for t in _LORA_MODULES[key] if t in names)
        config = peft.LoraConfig(r=point.lora_rank, lora_alpha=2 * point.lora_rank,
                                 lora_dropout=0.0, target_modules=targets)
        model = peft.get_peft_model(model, config)
        if point.ckpt == "reentrant":
            # Reentrant checkpointing needs an input that requires grad when the
            # embedding is frozen; Trainer/TRL users call this (PEFT does it in
            # prepare_model_for_kbit_training).
            model.enable_input_require_grads()
    model.train()
    return model


def make_optimizer(point, model):
    params = [p for p in model.parameters() if p.requires_grad]
    if point.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    kind = {"adamw-foreach": {"foreach": True}, "adamw-fused": {"fused": True},
            "adamw-forloop": {"foreach": False}}[point.optimizer]
    return torch.optim.AdamW(params, lr=1e-4, **kind)


def make_batch(point, config):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, config.vocab_size, (point.batch, point.seq), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def run(point, config_dict, out_path):
    model = apply_knobs(point, build_model(point, config_dict))
    optimizer = make_optimizer(point, model)
    batch = make_batch(point, model.config)
    autocast = point.precision == "bf16-mixed"
    meta = [("reference", point.name()), ("transformers", transformers.__version__),
            ("torch", torch.__version__)]
    with vramscope_trace.record(out_path, model=model, optimizer=optimizer, inputs=batch,
                                meta=meta):
        for _ in range(point.steps):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(**batch).loss
            loss.backward()
            del loss
            optimizer.step()


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
        try:
            run(point_from_json(job["point"]), job["config"], job["out"])
        except Exception as e:  # noqa: BLE001 - reported per point, the grid goes on
            with open(job["out"] + ".error", "w", encoding="utf-8") as f:
                f.write(f"{type(e).__name__}: {e}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
