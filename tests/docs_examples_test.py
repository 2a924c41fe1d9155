"""Every `vramscope` command shown in README.md and docs/*.md runs (issue 18).

Commands are taken from fenced code blocks: lines that start with `vramscope`,
`build/cli/vramscope` or `$ vramscope`, with `\\` continuations joined and `# comments`
dropped. Placeholder files of the examples (a trace, a snapshot, a results file, a
config) are replaced by the repository's own example inputs, and files the examples
write go to a temporary directory. A command passes when it exits 0 (a report, fits or
not) or 3 (validate's accuracy gate), never 2 (bad input) or a crash.
"""
import os
import pathlib
import re
import shlex
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
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


COMMANDS = commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize("where,line", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_runs(where, line, tmp_path):
    args = shlex.split(line)[1:]
    for i, a in enumerate(args):
        if a in INPUTS:
            args[i] = str(ROOT / INPUTS[a])
        elif a.endswith(OUTPUT_SUFFIXES) and not (ROOT / a).exists():
            args[i] = str(tmp_path / pathlib.Path(a).name)
    env = dict(os.environ, HF_HUB_OFFLINE="1")  # catalog ids resolve offline
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert p.returncode in (0, 3), f"{where}\nexit {p.returncode}: {p.stderr.strip()}"
