"""The Python package (python/vramscope, engine module vramscope._core) against the CLI.

The API must return exactly what the command prints with --json for the same knobs,
raise ValueError with the CLI's message for a bad knob, and its console script must
behave as the executable. Run by ctest (VRAMSCOPE_BIN) with the package imported from
build/python/ (scripts/build.sh builds the module there); or
    PYTHONPATH=build/python python3 -m pytest -q tests/python_api_test.py
"""
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
PYPATH = os.environ.get("VRAMSCOPE_PYTHONPATH", str(pathlib.Path(BIN).parents[1] / "python"))
sys.path.insert(0, PYPATH)
if "VRAMSCOPE_PYTHONPATH" not in os.environ:  # ctest sets it when the module is built
    pytest.importorskip("vramscope._core", reason="the Python module is not built")

import vramscope  # noqa: E402
from vramscope._knobs import to_flags  # noqa: E402

SNAPSHOTS = ROOT / "tests" / "data" / "snapshots"
# A few knob sets: the defaults, LoRA with checkpointing, bf16 weights with 8-bit AdamW on
# another GPU, and a sharded layout.
KNOB_SETS = [
    {},
    {"batch": 2, "seq": 512, "finetune": "lora", "lora_rank": 8, "grad_ckpt": "full"},
    {"seq": 1024, "precision": "bf16", "optimizer": "adamw-8bit", "gpu": "a100-80g"},
    {"seq": 1024, "gpus": 8, "zero": 3, "grad_ckpt": "full"},
]


def cli(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def cli_json(*args):
    p = cli(*args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def catalog():
    return [m["alias"] for m in cli_json("models")]


def test_models_match_the_catalog():
    assert [m["alias"] for m in vramscope.models()] == catalog()
    assert {g["name"] for g in vramscope.gpus()} >= {"h100-80g", "a100-80g"}


def api_outcome(model, knobs):
    """("ok", the report's data) or ("error", the ValueError's message)."""
    try:
        return "ok", vramscope.estimate(model, **knobs).data
    except ValueError as e:
        return "error", str(e)


def cli_outcome(model, knobs):
    p = cli("estimate", model, *to_flags(knobs), "--json")
    if p.returncode == 0:
        return "ok", json.loads(p.stdout)
    assert p.returncode == 2, p.stderr
    return "error", p.stderr.strip().removeprefix("vramscope: error: ")


@pytest.mark.parametrize("knobs", KNOB_SETS, ids=["defaults", "lora", "bf16-8bit", "zero3"])
def test_estimate_equals_cli_json_for_every_catalog_model(knobs):
    """Every catalog model: the same report, or the same error (ZeRO-3 of an encoder)."""
    models = catalog()
    # Several Python threads at once: the engine releases the GIL.
    with concurrent.futures.ThreadPoolExecutor(4) as pool, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = list(pool.map(lambda m: api_outcome(m, knobs), models))
        expected = list(pool.map(lambda m: cli_outcome(m, knobs), models))
    for model, outcome, want in zip(models, got, expected):
        assert outcome == want, model
    # The T5 entries refuse the default --attn sdpa (eager only: docs/lowering.md, "T5").
    t5 = sum("t5" in m for m in models)
    # A CLIP tower alone has no training step (it is a diffusion step's --text-encoder):
    # refused whatever the knobs, so not counted.
    towers = [m for m, (kind, msg) in zip(models, got)
              if kind == "error" and "has no training loss" in msg]
    assert len(towers) <= 3
    # The catalog's VAEs are --vae components: refused as trained models, not counted here.
    vaes = sum(m["model_type"] == "autoencoder_kl" for m in cli_json("models"))
    assert sum(kind == "ok" for kind, _ in got) >= len(models) - len(towers) - vaes - 8 - t5


def test_unet_knobs_reach_the_engine():
    """A diffusion UNet's knobs are keyword arguments like any other."""
    knobs = {"image_size": 768, "batch": 2, "finetune": "lora", "lora_targets": ["q", "k", "v", "o"],
             "precision": "bf16", "grad_ckpt": "full", "text_len": 77}
    report = vramscope.estimate("sd-1.5-unet", **knobs)
    want = cli_json("estimate", "sd-1.5-unet", *to_flags(knobs))
    assert report.peak_allocated_bytes == want["peak_allocated_bytes"]
    assert report["knobs"]["image_size"] == "768"
    assert report["saved_for_backward"] == want["saved_for_backward"]


@pytest.mark.parametrize("model,knobs", [
    ("qwen2.5-0.5b", {"loss": "trl-fused", "dpo": True, "finetune": "lora", "batch": 2}),
    ("qwen2.5-0.5b", {"loss": "trl-fused", "packing": True, "batch": 4, "seq": 512}),
    ("vit-base-patch16-224", {"batch": 16, "finetune": "lora", "grad_ckpt": "full"}),
    ("llama-3.2-1b", {"impl": "torchtune", "loss": "torchtune-chunked", "finetune": "lora",
                      "lora_dtype": "model", "precision": "bf16", "seq": 512}),
    ("llama-3.2-1b", {"impl": "litgpt", "loss": "litgpt-chunked", "precision": "bf16",
                      "seq": 512}),
    ("flux.1-dev-transformer", {"precision": "bf16", "grad_ckpt": "full", "image_size": 512}),
    ("t5-base", {"attn": "eager", "seq": 256, "target_len": 64, "batch": 4, "finetune": "lora",
                 "lora_targets": ["q", "v"]}),
    ("clip-vit-large-patch14", {"batch": 8, "finetune": "lora", "lora_targets": ["q", "k", "v", "o"],
                                "grad_ckpt": "full"}),
    ("sd-1.5-unet", {"vae": "sd-1.5-vae", "batch": 2, "image_size": 512}),
])
def test_trl_packing_and_vit_knobs_reach_the_engine(model, knobs):
    """TRL's steps, packed rows and a ViT: keyword arguments like any other knob."""
    report = vramscope.estimate(model, **knobs)
    want = cli_json("estimate", model, *to_flags(knobs))
    assert report.peak_allocated_bytes == want["peak_allocated_bytes"]
    assert report["knobs"] == want["knobs"]


def test_text_encoders_repeat_the_flag():
    """text_encoder=[a, b] is --text-encoder a --text-encoder b (SDXL's two encoders)."""
    knobs = {"batch": 2, "precision": "bf16",
             "text_encoder": ["sd-1.5-text-encoder", "sdxl-text-encoder-2"]}
    assert to_flags(knobs)[-4:] == ["--text-encoder", "sd-1.5-text-encoder",
                                    "--text-encoder", "sdxl-text-encoder-2"]
    report = vramscope.estimate("sdxl-base-unet", **knobs)
    want = cli_json("estimate", "sdxl-base-unet", *to_flags(knobs))
    assert report.peak_allocated_bytes == want["peak_allocated_bytes"]
    assert report.peak_allocated_bytes > vramscope.estimate(
        "sdxl-base-unet", batch=2, precision="bf16").peak_allocated_bytes


def test_report_attributes_are_the_json_keys():
    report = vramscope.estimate("llama-3-8b", batch=2)
    want = cli_json("estimate", "llama-3-8b", "--batch", "2")
    assert report.peak_allocated_bytes == want["peak_allocated_bytes"]
    assert report.peak_reserved_bytes == want["peak_reserved_bytes"]
    assert report.device_total_bytes == want["device_total_bytes"]
    assert report.breakdown == want["breakdown_at_peak"]
    assert report.assumptions == want["assumptions"]
    assert report["gpu"] == want["gpu"]


@pytest.mark.parametrize("command,args,knobs", [
    ("fit", ["llama-3-8b"], {"margin": "2GiB", "finetune": "lora"}),
    ("sweep", ["qwen2.5-0.5b"], {"seq": "512:2048:4", "batch": [1, 2]}),
    ("plan", ["llama-3.2-1b"], {"gpu": "a100-40g", "top": 3}),
    ("fit", ["sd-1.5-unet"], {"gpu": "a10g", "ema": True, "precision": "fp16-mixed"}),
])
def test_searches_equal_cli_json(command, args, knobs):
    result = getattr(vramscope, command)(*args, **knobs)
    assert result.data == cli_json(command, *args, *to_flags(knobs))
    assert result.text() == cli(command, *args, *to_flags(knobs)).stdout


def test_simulate_explain_compare_equal_cli_json():
    tiny = ROOT / "examples" / "tiny.events"
    assert vramscope.simulate(tiny).data == cli_json("simulate", str(tiny))
    snap = SNAPSHOTS / "oom.pickle"
    assert vramscope.explain(snap).data == cli_json("explain", str(snap))
    got = vramscope.compare(snap, "llama-3.2-1b", batch=2, seq=512)
    assert got.data == cli_json("compare", str(snap), "--", "llama-3.2-1b", "--batch", "2",
                                "--seq", "512")


def test_report_renders_what_the_cli_writes(tmp_path):
    report = vramscope.estimate("llama-3.2-1b", batch=2, seq=1024)
    p = cli("estimate", "llama-3.2-1b", "--batch", "2", "--seq", "1024",
            "--html", str(tmp_path / "cli.html"), "--svg", str(tmp_path / "cli.svg"),
            "--csv", str(tmp_path / "cli.csv"))
    assert p.returncode == 0, p.stderr
    assert report.text() == p.stdout
    report.to_html(tmp_path / "api.html")
    assert (tmp_path / "api.html").read_text() == (tmp_path / "cli.html").read_text()
    assert report.svg() == (tmp_path / "cli.svg").read_text()
    assert report.to_csv() == (tmp_path / "cli.csv").read_text()
    t = report.timeline
    n = len(t["allocated_bytes"])
    assert n > 10 and all(len(v) == n for v in t.values())
    assert max(t["allocated_bytes"]) == report.peak_allocated_bytes
    assert report.live_at_peak == report.data["top_allocations"]
    assert [a["what"] for a in report.assumptions]
    assert json.loads(report.to_json()) == report.data
    assert "<table>" in report._repr_html_() and "<svg" in report._repr_html_()


def test_timeline_frame_with_pandas():
    pd = pytest.importorskip("pandas")
    report = vramscope.estimate("llama-3.2-1b")
    frame = report.timeline_frame()
    assert isinstance(frame, pd.DataFrame)
    assert frame["allocated_bytes"].max() == report.peak_allocated_bytes


def test_the_gil_is_released_while_the_engine_runs():
    """A Python thread keeps running while another waits on a long sweep."""
    import threading

    done = threading.Event()
    ticks = 0

    def work():
        vramscope.sweep("llama-3-8b", seq="256:8192:40", batch=[1, 2, 4])
        done.set()

    thread = threading.Thread(target=work)
    thread.start()
    while not done.is_set():
        ticks += 1
    thread.join()
    assert ticks > 10000  # with the GIL held, the loop would stall for the whole sweep


def cli_error(*args):
    """The message of the CLI's one error line, without its prefix and "(see --help)"."""
    p = cli(*args)
    assert p.returncode == 2
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("vramscope: error: ")
    return line[len("vramscope: error: "):].removesuffix(" (see --help)")


@pytest.mark.parametrize("knobs", [
    {"precision": "fp8"}, {"batch": "x"}, {"batch": -1}, {"optimizer": "adam"},
    {"lora_targets": "q,nope", "finetune": "lora"}, {"zero": 5, "gpus": 2}, {"no_such_knob": 1},
    {"gpu": "tpu-v5"}, {"lora_dropout": float("nan")},
])
def test_bad_knob_raises_value_error_with_the_cli_message(knobs):
    with pytest.raises(ValueError) as e:
        vramscope.estimate("llama-3-8b", **knobs)
    assert str(e.value) == cli_error("estimate", "llama-3-8b", *to_flags(knobs))


def test_bad_model_and_output_flags():
    with pytest.raises(ValueError) as e:
        vramscope.estimate("no-such-model-anywhere")
    assert str(e.value) == cli_error("estimate", "no-such-model-anywhere")
    with pytest.raises(ValueError):
        vramscope.estimate("llama-3-8b", json=True)
    with pytest.raises(TypeError):
        vramscope.estimate(42)


def test_warnings_become_python_warnings():
    with pytest.warns(vramscope._api.VramscopeWarning, match="--lora-rank"):
        vramscope.estimate("llama-3.2-1b", lora_rank=8)


def console(*args):
    code = "import sys; from vramscope._cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": PYPATH})


@pytest.mark.parametrize("args", [
    ["estimate", "llama-3-8b", "--batch", "2", "--json"],
    ["estimate", "llama-3-8b", "--batch", "x"],
    ["fit", "llama-3.2-1b", "--precision", "fp8"],
    ["models"], ["gpus", "--json"], ["--version"], [],
])
def test_console_script_is_the_cli(args):
    got, want = console(*args), cli(*args)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)


def test_notebook_example_runs(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "notebook_estimate.py"),
                        str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": PYPATH})
    assert p.returncode == 0, p.stderr
    assert "peak allocated" in p.stdout
    assert (tmp_path / "llama-3-8b.html").stat().st_size > 1000
    assert (tmp_path / "timeline.svg").read_text().startswith("<")


def test_from_config_files():
    """from_= is --from (docs/configs.md); a list repeats the flag, one file each."""
    cfg = ROOT / "examples" / "configs"
    ds, hf = cfg / "ds_zero3_offload.json", cfg / "hf_fsdp.json"
    assert to_flags({"from_": [hf, str(ds)]}) == ["--from", str(hf), "--from", str(ds)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = vramscope.estimate("qwen2.5-0.5b", from_=ds).data
        both = vramscope.estimate("qwen2.5-0.5b", from_=[hf, ds]).data
    assert got == cli_json("estimate", "qwen2.5-0.5b", "--from", str(ds))
    assert both == cli_json("estimate", "qwen2.5-0.5b", "--from", str(hf), "--from", str(ds))
    with pytest.raises(ValueError) as e:
        vramscope.estimate("qwen2.5-0.5b", from_=cfg / "absent.json")
    assert "absent.json: no such file" in str(e.value)


def test_fit_answers_none_where_nothing_fits():
    """Issue 40: no micro-batch fits -> max_batch is None (0 read as an answer); `data` stays
    what `fit --json` prints."""
    none = vramscope.fit("qwen2.5-7b", gpu="l4")
    assert none.data["batch"]["fits"] is False and none.data["max_batch"] == 0
    assert none.max_batch is None and none.max_seq is None and none.min_gpus is None
    assert "max_batch=None" in repr(none) and "qwen2.5-7b" in repr(none)
    some = vramscope.fit("qwen2.5-0.5b", gpu="a100-80g")
    assert some.max_batch == some.data["max_batch"] >= 1
    assert some.max_seq == some.data["max_seq"] >= 1
    assert f"max_batch={some.max_batch}" in repr(some)


def test_reprs_show_values_not_keys():
    report = vramscope.estimate("qwen2.5-0.5b", seq=512)
    assert f"{report.peak_allocated_bytes / (1 << 30):.2f} GiB" in repr(report)
    sweep = vramscope.sweep("qwen2.5-0.5b", seq="256:512:2")
    text = repr(sweep)
    assert "seq=256" in text and "GiB" in text and "variables" not in text, text
    measured = vramscope.explain(SNAPSHOTS / "train_p4.pickle")
    assert measured.fits is None and "no fit verdict" in repr(measured)
    assert "no fit verdict" in measured._repr_html_()


def test_an_unknown_knob_is_named_as_an_unknown_flag():
    with pytest.raises(ValueError, match=r"unknown flag --lora-rnk \(did you mean --lora-rank\?\)"):
        vramscope.estimate("llama-3-8b", lora_rnk=8)
