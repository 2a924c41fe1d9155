"""No function in src/, cli/ or python/core/ (the extension module) over 80 lines (issue 16).

lizard (pinned in requirements/reference-tf5.txt, installed by scripts/python_env.sh) measures
each function's length in lines, comments included. Tests (*_test.cc), benchmarks and fuzz
targets are exempt.

    python3 tests/function_length_test.py     # prints the ten longest functions
"""
import csv
import io
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIZARD = ROOT / ".venv" / "tf5" / "bin" / "lizard"
LIMIT = 80


def functions():
    """(length, 'path:name') of every function in the checked sources."""
    assert LIZARD.exists(), f"{LIZARD} is missing: run scripts/python_env.sh"
    out = subprocess.run([str(LIZARD), "--csv", "src", "cli", "python/core", "web"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    found = []
    # lizard --csv: nloc, ccn, tokens, params, length, location, file, name, long name, start, end
    for row in csv.reader(io.StringIO(out)):
        path, name, length = row[6], row[7], int(row[4])
        if path.endswith(("_test.cc", "_bench.cc")) or "/fuzz_" in path or path.startswith("fuzz"):
            continue
        found.append((length, f"{path}:{name}"))
    return found


def test_no_function_is_over_the_limit():
    long_ones = sorted((length, key) for length, key in functions() if length > LIMIT)
    assert not long_ones, "split these:\n" + "\n".join(f"{k}: {n} lines" for n, k in long_ones)


def test_the_measure_sees_every_stage():
    """A broken lizard run (no files found) must not pass for a clean tree."""
    seen = {key.split(":")[0].split("/")[1] for _, key in functions() if key.startswith("src/")}
    assert {"alloc", "common", "events", "ingest", "lower", "plan", "report", "sim", "snapshot"} <= seen
    assert len(functions()) > 1000


if __name__ == "__main__":
    for length, key in sorted(functions(), reverse=True)[:10]:
        print(f"{length:5d}  {key}")
    sys.exit(0)
