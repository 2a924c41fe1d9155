"""Knobs that are allowed but likely not meant warn (stderr, one line each, exit 0);
impossible ones are errors (exit 2); a file that cannot be written fails before any work
or output (issue 18)."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def warnings(p):
    lines = p.stderr.splitlines()
    assert all(l.startswith("vramscope: warning: ") for l in lines), p.stderr
    return lines


def test_a_plain_setup_warns_nothing():
    p = run("estimate", "llama-3-8b", "--finetune", "lora", "--lora-rank", "8")
    assert p.returncode == 0 and p.stderr == ""


@pytest.mark.parametrize("command", ["estimate", "fit", "sweep", "plan"])
def test_lora_flags_without_lora_warn(command):
    seq = "256,512" if command == "sweep" else "512"
    p = run(command, "qwen2.5-0.5b", "--seq", seq, "--lora-rank", "8", "--lora-dropout", "0.1")
    assert p.returncode == 0, p.stderr
    lines = warnings(p)
    assert any("--lora-rank has no effect without --finetune lora" in l for l in lines)
    assert any("--lora-dropout has no effect" in l for l in lines)


def test_sequence_beyond_the_models_positions_warns():
    p = run("estimate", "gpt2", "--seq", "2048")
    assert p.returncode == 0
    [line] = warnings(p)
    assert "--seq 2048" in line and "1024 learned positions" in line
    p = run("estimate", "llama-3-8b", "--seq", "16384")
    assert p.returncode == 0
    [line] = warnings(p)
    assert "max_position_embeddings 8192" in line


def test_versions_outside_the_modelled_range_warn():
    p = run("estimate", "llama-3-8b", "--transformers-version", "4.30", "--torch-version", "2.20")
    assert p.returncode == 0
    lines = warnings(p)
    assert any("--transformers-version 4.30 is outside 4.36..5.24" in l for l in lines)
    assert any("--torch-version 2.20 is outside 2.0..2.13" in l for l in lines)


def test_flash_attention_in_fp32_is_an_error():
    p = run("estimate", "llama-3-8b", "--attn", "flash", "--precision", "fp32")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "flash-attn 2 runs in fp16 / bf16 only" in p.stderr


@pytest.mark.parametrize("args", [
    ["estimate", "gpt2", "--seq", "512", "--html", "/nonexistent-dir/report.html"],
    ["estimate", "gpt2", "--seq", "512", "--svg", "/tmp"],
    ["estimate", "gpt2", "--seq", "512", "--events", "/nonexistent-dir/x.events"],
    ["sweep", "gpt2", "--seq", "128,256", "--csv", "/nonexistent-dir/x.csv"],
    ["plan", "gpt2", "--seq", "512", "--html", "/nonexistent-dir/plan.html"],
    ["simulate", "examples/tiny.events", "--csv", "/nonexistent-dir/t.csv"],
])
def test_an_unwritable_output_fails_before_any_output(args):
    p = run(*args)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("vramscope: error: --") and p.stderr.count("\n") == 1


def run_with_terminal_stderr(*args):
    """Runs with stderr on a pseudo-terminal; returns (exit code, stdout, what the terminal got)."""
    import pty
    import select
    import tempfile
    master, slave = pty.openpty()
    stdout = tempfile.TemporaryFile()  # not a pipe: the table must not block the child
    env = dict(os.environ, VRAMSCOPE_PROGRESS_AFTER_MS="0")  # the 1 s threshold, moved for the test
    p = subprocess.Popen([BIN, *args], stdout=stdout, stderr=slave, cwd=ROOT, env=env)
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=60)
    os.close(master)
    stdout.seek(0)
    out = stdout.read().decode()
    return p.returncode, out, b"".join(chunks).decode(errors="replace")


def test_a_long_sweep_shows_progress_on_a_terminal_and_erases_it():
    args = ["sweep", "llama-3-8b", "--seq", "64:4096:60", "--batch", "1,2"]
    rc, out, term = run_with_terminal_stderr(*args)
    assert rc == 0
    assert "vramscope sweep: points: " in term and " of 120" in term
    assert term.endswith("\r\033[K")  # erased before the table
    assert "sweep: points" not in out
    rc, out, term = run_with_terminal_stderr("plan", "gpt2", "--seq", "512")
    assert rc == 0 and "vramscope plan: knob sets: " in term and term.endswith("\r\033[K")
    # Not a terminal: nothing on stderr.
    p = run(*args)
    assert p.returncode == 0 and p.stderr == ""


@pytest.mark.parametrize("args", [
    ["estimate", "gpt2", "--bogus-flag", "\x1b[2J\x07boom"],             # CLI11's parse error echoes it
    ["estimate", "gpt2", "--gpu", "\x1b]0;title\x07h100"],               # an unknown GPU name
    ["estimate", "gpt2", "--lora-targets", "q,\x1b[31mv"],               # an unknown target
    ["estimate", "gpt2", "--transformers-version", "4.\x1b[1m46"],       # a bad version
])
def test_errors_never_echo_control_characters(args):
    # issue 24: no terminal injection; one line, bounded length.
    p = run(*args)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("vramscope: error: ") and p.stderr.count("\n") == 1
    assert not any(ord(c) < 0x20 and c != "\n" or ord(c) == 0x7f for c in p.stderr), repr(p.stderr)


def test_a_huge_bad_value_gives_a_bounded_line():
    p = run("estimate", "gpt2", "--gpu", "x" * 100000)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and len(p.stderr) < 1200
