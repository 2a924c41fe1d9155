"""Shared by the --from FILE tests (from_config_test.py, from_accelerate_test.py,
from_axolotl_test.py): run the CLI on a model from the catalog and compare reports."""
import json
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
CFG = ROOT / "examples" / "configs"
MODEL = "qwen2.5-0.5b"


def run(*args, timeout=120):
    return subprocess.run([BIN, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def estimate(*args):
    p = run("estimate", MODEL, *args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def numbers(report):
    # "assumptions" legitimately differs: it says which file each knob came
    # from and lists the keys that are not modelled.
    return {k: v for k, v in report.items() if k != "assumptions"}


def lines(report, what):
    return [a["assumed"] for a in report["assumptions"] if a["what"] == what]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path
