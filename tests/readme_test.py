"""README.md and docs/*.md: every example runs and gives a plausible answer (issue 40 item 7).

- The quick-start excerpt (between the quickstart-excerpt markers) holds the verdict line and
  the "Assumed" section of the command scripts/setup.sh ends with (COMMAND below), as it
  prints today.
- Every `vramscope` command in a fenced code block (lines that start with `vramscope`,
  `build/cli/vramscope` or `$ vramscope`, `\\` continuations joined, `# comments` dropped)
  runs: placeholder inputs (a trace, a snapshot, a results file, a config) are replaced by the
  repository's own example inputs, files the examples write go to a temporary directory. It
  exits 0 (a report, fits or not) or 3 (validate's accuracy gate), never 2 (bad input) or a
  crash, and prints a plausible answer: something, and for the memory commands a memory figure
  above zero (a JSON report: its peak above zero).
- The README's Python examples run through the package (build/python), statement by statement;
  those that need what a test machine lacks are skipped with the reason in SKIPPED_PYTHON.
"""
import ast
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
PYPATH = os.environ.get("VRAMSCOPE_PYTHONPATH", str(pathlib.Path(BIN).parents[1] / "python"))
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# The examples' placeholder inputs, and the repository's files that stand in for them.
INPUTS = {
    "step.events": "examples/tiny.events",
    "run.pickle": "tests/data/snapshots/train_p4.pickle",
    "my.jsonl": "fuzz/corpus/groundtruth/01_ok.jsonl",
    "path/to/config.json": "data/models/llama-3-8b.json",
}
OUTPUT_SUFFIXES = (".html", ".svg", ".csv", ".events")


def commands():
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.strip()
                if line.startswith("$ "):
                    line = line[2:]
                if not re.match(r"(build/cli/)?vramscope [a-z]", line):
                    continue
                line = re.sub(r"\s+#.*$", "", line)
                found.append((f"{path.name}: {line}", line))
    return found



COMMAND = ["estimate", "llama-3-8b", "--finetune", "lora", "--batch", "1", "--seq", "2048", "--grad-ckpt", "full",
           "--explain"]


def test_setup_script_runs_the_command_the_readme_shows():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert " ".join(COMMAND) in setup


def test_quickstart_excerpt_matches_the_command():
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- quickstart-excerpt:begin -->\n```text\n(.*?)\n```\n<!-- quickstart-excerpt:end -->",
                  readme, re.S)
    assert m, "README.md lacks the quick-start excerpt"
    excerpt = m.group(1).splitlines()
    p = subprocess.run([BIN, *COMMAND], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    verdict = next(l for l in lines if l.startswith(("FITS", "DOES NOT FIT")))
    start = lines.index("Assumed (change with the flag named)")
    end = next(i for i in range(start, len(lines)) if not lines[i].strip())
    assert excerpt == [verdict, ""] + lines[start:end]


COMMANDS = commands()
# Commands whose answer is memory: their output must show a figure above zero.
MEMORY_COMMANDS = ("estimate", "fit", "sweep", "plan", "simulate", "replay", "explain", "compare")
FIGURE = re.compile(r"(?<![\d.])(?:[1-9][\d,]*(?:\.\d+)?|0\.\d*[1-9]\d*) (?:GiB|MiB|KiB)\b")


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20


def plausible(args, stdout):
    """Why `stdout` is not a plausible answer to `vramscope ARGS`, or None."""
    if not stdout.strip():
        return "printed nothing"
    if args[0] not in MEMORY_COMMANDS:
        return None
    if "--json" in args:
        data = json.loads(stdout)
        peaks = [v for k, v in _walk(data) if k.endswith("_bytes") and isinstance(v, (int, float))]
        return None if any(v > 0 for v in peaks) else "no byte figure above zero in the JSON"
    if "--csv" in args and not any(a.endswith(".csv") for a in args):
        return None if re.search(r"\d", stdout) else "a CSV without numbers"
    return None if FIGURE.search(stdout) else "no memory figure above zero"


def _walk(value, key=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)
    else:
        yield key, value


@pytest.mark.parametrize("where,line", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_runs_and_answers(where, line, tmp_path):
    args = shlex.split(line)[1:]
    for i, a in enumerate(args):
        if a in INPUTS:
            args[i] = str(ROOT / INPUTS[a])
        elif a.endswith(OUTPUT_SUFFIXES) and not (ROOT / a).exists():
            args[i] = str(tmp_path / pathlib.Path(a).name)
    env = dict(os.environ, HF_HUB_OFFLINE="1")  # catalog ids resolve offline
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert p.returncode in (0, 3), f"{where}\nexit {p.returncode}: {p.stderr.strip()}"
    why = plausible(args, p.stdout)
    assert why is None, f"{where}: {why}\n{p.stdout[:2000]}"


# --- The Python examples ------------------------------------------------------------------

# Statements of the docs' Python examples that a test machine cannot run, by a piece of their
# text, with the reason. Everything else runs.
SKIPPED_PYTHON = {
    "r.timeline_frame()": "needs pandas, not a dependency of the package",
    "import torch": "needs torch and transformers (tests/python runs the module path in .venv/tf5)",
    "AutoConfig.from_pretrained": "needs the network (the Hugging Face Hub)",
    "with torch.device": "needs torch",
    "vramscope.estimate(model": "needs the torch module built above",
    "vramscope.estimate(config": "needs the config fetched above",
    "MemoryCheckCallback": "needs transformers and a training run",
    "transformers.Trainer": "needs transformers, a model and a data set",
    "check.oom_guard": "needs a Trainer and a CUDA GPU",
    "vramscope.check(": "needs a model and an optimizer (and a CUDA GPU to measure)",
    "torch.cuda": "needs a CUDA GPU",
    "vramscope.trace.record": "needs torch, a model and an optimizer",
    "...": "a placeholder for the user's own training steps",
}
# The examples' placeholder files, and the repository's files that stand in for them.
PYTHON_INPUTS = {
    '"step.events"': repr(str(ROOT / "examples" / "tiny.events")),
    '"oom.pickle"': repr(str(ROOT / "tests" / "data" / "snapshots" / "train_p4.pickle")),
}


def python_examples():
    found = []
    for path in DOCS:
        for block in re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
            for node in ast.parse(block).body:
                found.append((path.name, ast.get_source_segment(block, node)))
    return found


PYTHON = python_examples()


def skip_reason(statement):
    return next((why for piece, why in SKIPPED_PYTHON.items() if piece in statement), None)


def check_answer(statement, value):
    """A plausible answer: a report's peak above zero, a fit's batch, a sweep's points, ..."""
    name = type(value).__name__
    if name == "Report":
        assert value.peak_allocated_bytes > 0, statement
    elif name == "FitResult":
        assert value.max_batch is not None or value.max_seq is not None, statement
    elif isinstance(value, tuple):
        for v in value:
            check_answer(statement, v)
    elif statement.endswith(".max_batch"):
        assert isinstance(value, int) and value >= 1, f"{statement}: {value!r}"
    elif statement.endswith(".points"):
        assert value and all(p["peak_allocated_bytes"] > 0 for p in value if "peak_allocated_bytes" in p)
    elif name == "Result":
        assert value.data, statement
    elif isinstance(value, (str, bytes, list, dict)):
        assert value, statement


def test_the_readme_has_python_examples_that_run():
    ran = [s for _, s in PYTHON if skip_reason(s) is None]
    assert len(ran) >= 8, ran


def test_python_examples_answer(tmp_path, monkeypatch):
    sys.path.insert(0, PYPATH)
    if "VRAMSCOPE_PYTHONPATH" not in os.environ:  # ctest sets it when the module is built
        pytest.importorskip("vramscope._core", reason="the Python module is not built")
    import vramscope
    monkeypatch.chdir(tmp_path)  # report.html, timeline.svg
    scope = {"vramscope": vramscope}
    for where, statement in PYTHON:
        if skip_reason(statement) or statement.startswith(("import", "from")) and "vramscope" not in statement:
            continue
        for placeholder, real in PYTHON_INPUTS.items():
            statement = statement.replace(placeholder, real)
        tree = ast.parse(statement)
        if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
            value = eval(compile(ast.Expression(tree.body[0].value), where, "eval"), scope)  # noqa: S307
            check_answer(statement, value)
        else:
            exec(compile(tree, where, "exec"), scope)  # noqa: S102
    assert isinstance(scope.get("r"), vramscope.Report)
