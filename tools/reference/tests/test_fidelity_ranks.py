"""The multi-rank fidelity gate: real DDP / FSDP / DeepSpeed ZeRO ranks vs the lowering.

Runs `--grid ranks` live (vsref/ranks.py: 2 and 4 ranks over gloo, every rank recorded
tensor by tensor) and compares every rank with `vramscope estimate --gpus N ...
--device-rules cpu`. Every rank of every point must be within 1% of its recorded peak in
every phase (a multi-rank point's setup at its end), unless listed in
tools/reference/known_gaps.txt, which only shrinks (test_fidelity.py's rules). The
committed results (data/fidelity/ranks.json) and the multi-rank table of
docs/fidelity.md must be what the grid gives now.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from vsref import fidelity, gate  # noqa: E402
from vsref.grid import ranks_points  # noqa: E402

RESULTS = os.path.join(fidelity.ROOT, "data", "fidelity", "ranks.json")
REGENERATE = ("regenerate with: python3 tools/reference/fidelity.py run --grid ranks "
              "--out data/fidelity/ranks.json && python3 tools/reference/fidelity.py table "
              "data/fidelity/ranks.json --markdown docs/fidelity.md --section ranks")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    if not os.path.exists(fidelity.venv_python(5)):
        pytest.fail(f"{fidelity.venv_python(5)} is missing: run scripts/python_env.sh")
    if not os.path.exists(fidelity.VRAMSCOPE):
        pytest.fail(f"{fidelity.VRAMSCOPE} is missing: run scripts/build.sh")
    points = ranks_points()
    live = fidelity.run_points(points, str(tmp_path_factory.mktemp("ranks")))
    return _rerun_points_off_once(points, live, tmp_path_factory)


def _rerun_points_off_once(points, live, tmp_path_factory):
    """Runs once more each point with a rank row off by more than 1%, and keeps the rerun.

    On an idle machine two whole runs are identical to the byte. Under load, FSDP2 backward
    rows were once recorded 2.4-4.9% high, before vsref/gloo_order.py drained every
    collective (it had missed all_gather_single / reduce_scatter_single); the rerun stays
    as a guard against a release path not yet drained. The
    rerun is a real recording too, held to the same 1%, so a rule that is wrong fails both
    runs; the points rerun are printed."""
    off = {r["name"].rsplit("/rank", 1)[0] for r in live
           if "error" not in r and not fidelity.within_tolerance(r)}
    again = [p for p in points if p.name() in off]
    if not again:
        return live
    print("rerun once (a rank row off by more than 1%):", ", ".join(sorted(off)))
    rerun = {r["name"]: r for r in
             fidelity.run_points(again, str(tmp_path_factory.mktemp("ranks-rerun")))}
    return [rerun.get(r["name"], r) for r in live]


def test_grid_covers_the_libraries():
    """At least 40 points over DDP, ZeRO-1/2/3 (with and without offload and zero.Init)
    and FSDP 1 and 2 (full and LoRA fine-tuning), on 2 and 4 ranks."""
    points = ranks_points()
    assert len(points) >= 40
    dists = {p.dist for p in points}
    assert dists == {"ddp", "fsdp1", "fsdp2", "zero1", "zero2", "zero3"}
    assert {p.gpus for p in points} == {2, 4}
    assert any(p.dist_offload for p in points) and any(not p.zero_init for p in points)
    for dist in ("fsdp1", "fsdp2"):
        assert {p.finetune for p in points if p.dist == dist} >= {"full", "lora"}


def test_every_rank_was_recorded(live):
    errors = gate.ran_without_error(live)
    assert not errors, "\n".join(errors)
    for point in ranks_points():
        rows = [r for r in live if r["name"].startswith(point.name() + "/rank")]
        assert len(rows) == point.gpus, point.name()


def test_ranks_within_one_percent_unless_a_known_gap(live):
    off = gate.off_by_more_than_one_percent(live, gate.known_gaps(ranks=True))
    assert not off, "off by more than 1% of the recorded peak:\n" + "\n".join(off)


def test_known_gaps_only_shrink(live):
    fixed, unknown = gate.gaps_to_remove(live, gate.known_gaps(ranks=True))
    assert not fixed, f"now within 1%: remove from tools/reference/known_gaps.txt: {fixed}"
    assert not unknown, f"known_gaps.txt names rank rows not in the grid: {unknown}"


def test_committed_predictions_are_current(live):
    # The prediction side to the byte; the recorded side is a live measurement that varies
    # by a few bytes between runs of real ranks (docs/fidelity.md), held to 1% above.
    assert gate.predictions_are_current(live, RESULTS), \
        f"data/fidelity/ranks.json is stale; {REGENERATE}"


def test_doc_table_is_current():
    assert gate.table_is_current(RESULTS, "ranks"), f"docs/fidelity.md is stale; {REGENERATE}"
