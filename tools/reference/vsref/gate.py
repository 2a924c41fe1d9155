"""What the two fidelity gates (tests/test_fidelity.py, one process; tests/test_fidelity_ranks.py,
several ranks) check of a live run of their grid: each result within 1% unless a known gap, the
gap list only shrinking, the committed results and docs/fidelity.md's table current."""

import json
import os

from . import fidelity

GAPS = os.path.join(fidelity.ROOT, "tools", "reference", "known_gaps.txt")
DOC = os.path.join(fidelity.ROOT, "docs", "fidelity.md")


def known_gaps(ranks: bool) -> set:
    """The names in known_gaps.txt of one gate: rank rows (`.../rankR`) or single points."""
    with open(GAPS, encoding="utf-8") as f:
        names = {line.split("#")[0].strip() for line in f} - {""}
    return {n for n in names if ("/rank" in n) == ranks}


def ran_without_error(live) -> list:
    return [f"{r['name']}: {r['error']}" for r in live if "error" in r]


def off_by_more_than_one_percent(live, gaps: set) -> list:
    return [f"{r['name']}: worst phase {r['worst_phase']} {r['worst_phase_error_pct']:+.2f}% "
            f"({r['first_divergence']})"
            for r in live if "error" not in r and r["name"] not in gaps
            and not fidelity.within_tolerance(r)]


def gaps_to_remove(live, gaps: set) -> tuple:
    """(gaps now within 1%, gaps naming nothing in the grid): both must leave the list."""
    names = {r["name"] for r in live}
    fixed = sorted(r["name"] for r in live if r["name"] in gaps and fidelity.within_tolerance(r))
    return fixed, sorted(gaps - names)


def results_are_current(live, path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        committed = json.load(f)
    return json.loads(json.dumps(live, sort_keys=True)) == committed


def predictions(results) -> list:
    """What the lowering predicted for each row: every key a rule change moves, none of the
    recording's (gloo's threads make a rank's recording vary by a few bytes between runs,
    within the 1% every row is held to)."""
    return [{"name": r["name"], "point": r.get("point"),
             "predicted_peak_bytes": r.get("predicted_peak_bytes"),
             "predicted_peak_at": r.get("predicted_peak_at"),
             "predicted_saved_per_layer": r.get("predicted_saved_per_layer"),
             "phases": [(p["step"], p["phase"], p["predicted_bytes"]) for p in r.get("phases", [])]}
            for r in json.loads(json.dumps(results, sort_keys=True))]


def predictions_are_current(live, path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        return predictions(live) == predictions(json.load(f))


def table_is_current(path: str, section: str) -> bool:
    with open(path, encoding="utf-8") as f:
        table = fidelity.markdown_table(json.load(f))
    begin, end = fidelity.SECTIONS[section]
    with open(DOC, encoding="utf-8") as f:
        return f"{begin}\n{table}{end}" in f.read()
