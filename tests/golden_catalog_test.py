"""Every catalog model x a set of knobs, text and JSON, byte for byte (issue 16).

A regression check, not evidence of accuracy: the expected outputs are the engine's own,
recorded before the lowering's redesign, so that a refactoring that changes any number,
word or key anywhere in the catalog fails here. Accuracy comes from docs/fidelity.md.

When a change is meant to alter outputs, regenerate and review the diff:

    python3 tests/golden_catalog_test.py --update      # rewrites tests/golden/catalog.json.gz
    python3 tests/golden_catalog_test.py --diff        # what differs, per model and knob set
"""
import concurrent.futures
import difflib
import gzip
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
GOLDEN = ROOT / "tests" / "golden" / "catalog.json.gz"

# One knob set per lowering path the redesign touches: single GPU full/LoRA/QLoRA with
# checkpointing and each optimizer family, DDP, ZeRO 1-3, FSDP 1/2, Megatron TP/PP/SP, CP, EP.
KNOB_SETS = {
    "default": [],
    "lora-ckpt": ["--finetune", "lora", "--grad-ckpt", "full", "--batch", "2", "--seq", "1024"],
    "qlora-reentrant": ["--finetune", "qlora", "--grad-ckpt", "reentrant", "--attn", "eager",
                        "--optimizer", "paged-adamw-8bit", "--seq", "512"],
    "bf16-fused-accum": ["--precision", "bf16", "--optimizer", "adamw-fused", "--grad-accum", "2",
                         "--loss", "chunked", "--seq", "1024"],
    "fp16-sgd-scaler": ["--precision", "fp16-mixed", "--optimizer", "sgd-momentum", "--seq", "256"],
    "ddp-4": ["--gpus", "4", "--ddp", "--seq", "512"],
    "zero2-8": ["--gpus", "8", "--zero", "2", "--grad-ckpt", "full"],
    "zero3-8": ["--gpus", "8", "--zero", "3", "--grad-ckpt", "full", "--offload", "optimizer"],
    "zero3-noinit": ["--gpus", "4", "--zero", "3", "--no-zero-init", "--seq", "512"],
    "fsdp1-full": ["--gpus", "8", "--fsdp", "full", "--fsdp-version", "1", "--finetune", "lora"],
    "fsdp2-hybrid": ["--gpus", "16", "--fsdp", "hybrid", "--grad-ckpt", "full"],
    "fsdp2-qlora": ["--gpus", "2", "--fsdp", "full", "--finetune", "qlora", "--precision", "bf16"],
    "megatron": ["--tp", "2", "--pp", "2", "--sp", "--microbatches", "4", "--zero", "1"],
    "megatron-interleaved": ["--tp", "2", "--pp", "2", "--virtual-stages", "2", "--microbatches", "4"],
    "cp": ["--cp", "2", "--seq", "4096", "--zero", "1"],
    "ep": ["--ep", "2", "--gpus", "4", "--zero", "1", "--seq", "1024"],
}
# Text with --explain is the longest human report; JSON carries every number.
FORMATS = {"text": ["--explain", "--top", "8"], "json": ["--json", "--top", "8"]}

# The other commands, each once as text and once as JSON where it has JSON: what the CLI
# and report/ redesign must keep (snapshot readers, replay, compare, fit, sweep, plan).
SNAP = "tests/data/snapshots/"
COMMANDS = {
    "explain-train": ["explain", SNAP + "train_p4.pickle", "--top", "8"],
    "explain-oom": ["explain", SNAP + "oom.pickle", "--top", "8"],
    "explain-json-trace": ["explain", SNAP + "train_1step.json", "--top", "8"],
    "explain-old-torch": ["explain", SNAP + "torch1_13.pickle"],
    "replay-expandable": ["replay", SNAP + "train_p4.pickle", "--alloc-conf", "expandable_segments:True"],
    "replay-gpu": ["replay", SNAP + "train_p5.pickle", "--gpu", "a100-40g"],
    "compare": ["compare", SNAP + "train_1step.json", "--", "qwen2.5-0.5b", "--seq", "512"],
    "fit": ["fit", "qwen2.5-0.5b"],
    "fit-lora": ["fit", "llama-3-8b", "--finetune", "lora", "--grad-ckpt", "full"],
    "sweep": ["sweep", "qwen2.5-0.5b", "--seq", "512,1024,4096", "--batch", "1,2"],
    "plan": ["plan", "llama-3-8b"],
    "plan-8": ["plan", "mistral-7b-v0.1", "--gpus", "8"],
    # Sharding paths the catalog knob sets leave out, on two models each.
    "zero1-offload": ["estimate", "qwen2.5-0.5b", "--gpus", "4", "--zero", "1", "--offload", "optimizer"],
    "zero2-offload": ["estimate", "llama-3-8b", "--gpus", "8", "--zero", "2", "--offload", "optimizer",
                      "--finetune", "lora"],
    "zero3-offload-params": ["estimate", "mistral-7b-v0.1", "--gpus", "8", "--zero", "3", "--offload", "params"],
    "fsdp-offload": ["estimate", "llama-3-8b", "--gpus", "4", "--fsdp", "full", "--offload", "params"],
    "fsdp1-gradop": ["estimate", "qwen2.5-0.5b", "--gpus", "4", "--fsdp", "grad-op", "--fsdp-version", "1"],
    "ddp-bucket-view": ["estimate", "qwen2.5-0.5b", "--gpus", "2", "--ddp", "--gradient-as-bucket-view",
                        "--ddp-bucket-cap-mb", "50"],
    "fp16-zero3-8bit": ["estimate", "llama-3-8b", "--gpus", "8", "--zero", "3", "--precision", "fp16-mixed",
                        "--optimizer", "adamw-8bit", "--grad-accum", "2"],
    "models": ["models"],
    "gpus": ["gpus"],
}


def catalog_aliases():
    out = subprocess.run([BIN, "models", "--json"], capture_output=True, text=True, check=True).stdout
    return sorted(m["alias"] for m in json.loads(out))


def argv_of(key):
    if key.startswith("cmd|"):
        _, name, fmt = key.split("|")
        return [BIN, *COMMANDS[name], *(["--json"] if fmt == "json" else [])]
    model, knobs, fmt = key.split("|")
    return [BIN, "estimate", model, *KNOB_SETS[knobs], *FORMATS[fmt]]


def run_one(key):
    argv = argv_of(key)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    return key, {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


# Under the sanitizers (scripts/test_sanitize.sh sets VRAMSCOPE_TEST_TIME_FACTOR) every
# sixth output is enough to find memory errors; the release build compares all of them.
SAMPLE_EVERY = 6 if float(os.environ.get("VRAMSCOPE_TEST_TIME_FACTOR", "1")) > 1 else 1


def current_outputs(sample_every=1):
    keys = [f"{m}|{k}|{f}" for m in catalog_aliases() for k in KNOB_SETS for f in FORMATS]
    keys += [f"cmd|{c}|{f}" for c in COMMANDS for f in FORMATS]
    keys = keys[::sample_every]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(pool.map(run_one, keys))


def golden_outputs():
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as f:
        return json.load(f)


def differences(expected, actual):
    """One readable unified diff per key whose output changed."""
    for key in sorted(set(expected) | set(actual)):
        if expected.get(key) == actual.get(key):
            continue
        old, new = expected.get(key, {}), actual.get(key, {})
        lines = [f"== {key}: rc {old.get('rc')} -> {new.get('rc')}"]
        for stream in ("stdout", "stderr"):
            lines += difflib.unified_diff(old.get(stream, "").splitlines(),
                                          new.get(stream, "").splitlines(),
                                          f"golden {stream}", f"now {stream}", n=1, lineterm="")
        yield "\n".join(lines)


def test_every_catalog_model_and_knob_set_prints_what_it_printed_before():
    actual = current_outputs(SAMPLE_EVERY)
    expected = {k: v for k, v in golden_outputs().items() if k in actual or SAMPLE_EVERY == 1}
    diffs = list(differences(expected, actual))
    assert not diffs, f"{len(diffs)} outputs changed:\n" + "\n".join(d[:3000] for d in diffs[:5])


def test_the_golden_set_covers_the_catalog_and_every_path():
    golden = {k: v for k, v in golden_outputs().items() if not k.startswith("cmd|")}
    models = {k.split("|")[0] for k in golden}
    assert models == set(catalog_aliases())
    assert len(golden) == len(models) * len(KNOB_SETS) * len(FORMATS)
    # Most combinations lower and simulate; the rest must be clear one-line refusals.
    ok = sum(1 for v in golden.values() if v["rc"] == 0)
    assert ok > 0.6 * len(golden)
    assert all(v["rc"] in (0, 2) for v in golden.values())


def test_no_catalog_model_crashes_under_any_knob_set():
    """OPT-350m under --pp once aborted on an internal check (project_in on the wrong stage)."""
    crashed = [k for k, v in golden_outputs().items() if v["rc"] not in (0, 2)]
    assert not crashed
    for knobs in ("megatron", "megatron-interleaved"):
        assert run_one(f"opt-350m|{knobs}|json")[1]["rc"] == 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        data = current_outputs()
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        with gzip.GzipFile(GOLDEN, "wb", compresslevel=9, mtime=0) as f:
            f.write(json.dumps(data, sort_keys=True, indent=0).encode())
        print(f"wrote {len(data)} outputs to {GOLDEN.relative_to(ROOT)} ({GOLDEN.stat().st_size} bytes)")
    elif sys.argv[1:] == ["--diff"]:
        for d in differences(golden_outputs(), current_outputs()):
            print(d)
    else:
        sys.exit("usage: golden_catalog_test.py --update | --diff (or run it under pytest)")
