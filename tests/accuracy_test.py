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


def test_every_known_gap_names_a_committed_record_that_still_misses():
    # The gate leaves the known gaps out; each must name a committed ok record, and
    # `validate --thresholds` itself fails once one is within every limit.
    import json
    gaps = json.loads((DATA / "thresholds.json").read_text()).get("known_gaps", {})
    ok_ids = {json.loads(line)["id"] for path in DATA.glob("*.jsonl")
              for line in path.read_text().splitlines() if json.loads(line)["status"] == "ok"}
    assert set(gaps) <= ok_ids, sorted(set(gaps) - ok_ids)
    out = run("validate", str(DATA), "--thresholds", str(DATA / "thresholds.json")).stdout
    for gap in gaps:
        assert f"outside the gate (a known gap): {gap}:" in out


def test_readme_accuracy_table_is_generated():
    table = run("validate", str(DATA), "--markdown").stdout.rstrip("\n")
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- accuracy:begin -->\n(.*?)<!-- accuracy:end -->", readme, re.S)
    assert m, "README.md lacks the accuracy markers"
    assert m.group(1).rstrip("\n") == table, "README accuracy table is stale: run scripts/update_accuracy.sh"


def _measured_context_mib(gpu_name):
    """The most common (device used - reserved) at a phase's end, MiB, over the committed
    ok records of one GPU: the driver's context plus the kernels a training step loaded."""
    import collections
    import json
    counts = collections.Counter()
    for path in DATA.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["status"] != "ok" or rec["env"]["gpu"]["name"] != gpu_name:
                continue
            for ph in rec["phases"]:
                counts[round((ph["end_device_used_bytes"] - ph["end_reserved_bytes"]) / 2**20)] += 1
    return counts.most_common(1)[0][0] if counts else None


def test_h100_context_figure_is_the_measured_one():
    # gpu_catalog.cc takes the H100 80GB's context from these measurements; this
    # recomputes it from the records so that the constant cannot drift from the data.
    measured = _measured_context_mib("NVIDIA H100 80GB HBM3")
    assert measured is not None
    import json
    gpus = json.loads(run("gpus", "--json").stdout)
    entry = next(g for g in gpus if g["name"] == "h100-80g")
    assert abs(entry["cuda_context_bytes"] / 2**20 - measured) <= 4, (entry, measured)
