"""The accuracy gate: every committed real measurement (data/groundtruth/) is
validated against the thresholds in data/groundtruth/thresholds.json, and
README.md's accuracy table is the current output of `validate --markdown`."""
import os
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
DATA = ROOT / "data" / "groundtruth"


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_committed_measurements_pass_the_accuracy_gate():
    p = run("validate", str(DATA), "--thresholds", str(DATA / "thresholds.json"))
    assert p.returncode == 0, p.stdout + p.stderr


def test_readme_accuracy_table_is_generated():
    table = run("validate", str(DATA), "--markdown").stdout.rstrip("\n")
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- accuracy:begin -->\n(.*?)<!-- accuracy:end -->", readme, re.S)
    assert m, "README.md lacks the accuracy markers"
    assert m.group(1).rstrip("\n") == table, "README accuracy table is stale: run scripts/update_accuracy.sh"
