"""README.md's quick-start excerpt is what the quick-start command prints today.

The excerpt (between the quickstart-excerpt markers) holds the verdict line and the
"Assumed" section of the command scripts/setup.sh ends with (COMMAND below).
"""
import os
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
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
