"""tools/groundtruth/next_lease.sh --dry-run on CPU: every part's configurations parse, get a
plan, and map to a `vramscope estimate` command the CLI accepts (when it is built)."""

import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import TOOL_DIR
from gtlib import grid, models

REPO = TOOL_DIR.parents[1]
SCRIPT = TOOL_DIR / "next_lease.sh"
BIN = os.environ.get("VRAMSCOPE_BIN", str(REPO / "build" / "cli" / "vramscope"))
PART_GRIDS = ("cuda-rules", "dist-ws1", "sdpa", "bert", "gaps", "gaps-setup")


@pytest.fixture(scope="module")
def dry_run():
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("NL_PARTS", None)
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def grid_configs(name):
    return grid.load_grid(TOOL_DIR / "grids" / f"{name}.toml")


def test_every_part_and_configuration_is_planned(dry_run):
    for name in PART_GRIDS:
        assert f"grids/{name}.toml" in dry_run
        for config in grid_configs(name):
            assert f"{config.id}  {config.name}" in dry_run
    assert "skipped:" not in dry_run  # a model or plan the harness would refuse
    ids = re.findall(r"^([0-9a-f]{12})  ", dry_run, flags=re.M)
    assert len(ids) == len(re.findall(r"^    vramscope estimate ", dry_run, flags=re.M))


def test_estimate_commands_run(dry_run):
    if not os.access(BIN, os.X_OK):
        pytest.skip(f"{BIN} not built (scripts/build.sh, or set VRAMSCOPE_BIN)")
    commands = [shlex.split(line.strip())[2:] for line in dry_run.splitlines()
                if line.startswith("    vramscope estimate ")]

    def estimate(args):
        done = subprocess.run([BIN, "estimate", *args, "--json"], capture_output=True,
                              text=True, timeout=120, cwd=REPO, check=False)
        return args, done

    with ThreadPoolExecutor(max_workers=4) as pool:
        for args, done in pool.map(estimate, commands):
            assert done.returncode == 0, f"{shlex.join(args)}: {done.stderr[-1000:]}"
            assert json.loads(done.stdout)["peak_allocated_bytes"] > 0


def head_dim(config):
    hidden = config.get("hidden_size") or config.get("n_embd")
    heads = config.get("num_attention_heads") or config.get("n_head")
    return config.get("head_dim") or hidden // heads, heads, config.get("num_key_value_heads", heads)


def test_sdpa_part_covers_head_dims_dtypes_gqa_and_dropout():
    seen = set()
    for c in grid_configs("sdpa"):
        cfg = models.resolve_model(c.knobs["model"], (REPO / "data" / "models",
                                                      TOOL_DIR / "configs")).config
        dim, heads, kv = head_dim(cfg)
        dropout = (cfg.get("attention_dropout") or cfg.get("attn_pdrop") or 0) > 0
        seen.add((dim, c.knobs["precision"], kv < heads, dropout))
    assert {d for d, *_ in seen} == {64, 96, 128, 256}
    assert {p for _, p, *_ in seen} == {"fp32", "bf16"}
    assert {(gqa, drop) for *_, gqa, drop in seen} == {(True, False), (False, False),
                                                        (False, True), (True, True)}


def test_bert_part_and_gaps_keep_their_records_ids():
    bert = grid_configs("bert")
    assert {c.knobs["attn"] for c in bert} == {"eager", "sdpa"}
    gap_ids = {c.id for c in grid_configs("gaps")} | {c.id for c in grid_configs("gaps-setup")}
    # The committed records these parts measure again (docs/groundtruth.md, "Known gaps").
    assert {"a78c20bef58e", "c39607342b79", "ef7fab7b47dc", "39fe249c70c2"} <= gap_ids


def test_parts_can_be_selected():
    env = {**os.environ, "PYTHON": sys.executable, "NL_PARTS": "bert"}
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True,
                          timeout=120, env=env, check=False)
    assert done.returncode == 0
    assert "grids/bert.toml" in done.stdout and "grids/sdpa.toml" not in done.stdout
