"""The fidelity gate: real transformers / PEFT training steps on CPU vs the lowering.

Runs the whole grid live (about 30 s on two cores): every point is recorded with the real
libraries in .venv/tf5 and .venv/tf4 and lowered with `vramscope estimate --device-rules
cpu`. A point must be within 1% of its recorded peak in every phase, unless it is listed
in tools/reference/known_gaps.txt (rules known to be wrong, open work). That list is a
ratchet: a listed point that now passes fails the test until it is removed, so the list
only shrinks. The committed results (data/fidelity/results.json) and the table in
docs/fidelity.md must be what the grid gives now.
"""

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from vsref import fidelity, gate  # noqa: E402
from vsref.grid import full_grid  # noqa: E402

RESULTS = os.path.join(fidelity.ROOT, "data", "fidelity", "results.json")
REGENERATE = ("regenerate with: python3 tools/reference/fidelity.py run --grid full "
              "--out data/fidelity/results.json && python3 tools/reference/fidelity.py table "
              "data/fidelity/results.json --markdown docs/fidelity.md")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    for tf in (5, 4):
        if not os.path.exists(fidelity.venv_python(tf)):
            pytest.fail(f"{fidelity.venv_python(tf)} is missing: run scripts/python_env.sh")
    if not os.path.exists(fidelity.VRAMSCOPE):
        pytest.fail(f"{fidelity.VRAMSCOPE} is missing: run scripts/build.sh")
    return fidelity.run_points(full_grid(), str(tmp_path_factory.mktemp("fidelity")))


def test_every_point_ran(live):
    errors = gate.ran_without_error(live)
    assert not errors, "\n".join(errors)


def test_points_within_one_percent_unless_a_known_gap(live):
    off = gate.off_by_more_than_one_percent(live, gate.known_gaps(ranks=False))
    assert not off, "off by more than 1% of the recorded peak:\n" + "\n".join(off)


def test_known_gaps_only_shrink(live):
    """A listed point that now passes must leave the list (the gate only tightens)."""
    fixed, unknown = gate.gaps_to_remove(live, gate.known_gaps(ranks=False))
    assert not unknown, f"known_gaps.txt names points not in the grid: {unknown}"
    assert not fixed, f"now within 1%: remove from tools/reference/known_gaps.txt: {fixed}"


def test_committed_results_are_current(live):
    assert gate.results_are_current(live, RESULTS), \
        f"data/fidelity/results.json is stale; {REGENERATE}"


def test_doc_table_is_current():
    assert gate.table_is_current(RESULTS, ""), f"docs/fidelity.md is stale; {REGENERATE}"


def test_opt_350m_post_norm_config_estimates(tmp_path):
    """Regression: OPT-350m's published config (do_layer_norm_before false,
    word_embed_proj_dim 512) crashed `estimate` with a segmentation fault."""
    import subprocess

    proc = subprocess.run([fidelity.VRAMSCOPE, "estimate", "opt-350m", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["model"]["parameters"] == 331196416
    assert report["peak_allocated_bytes"] > 0
