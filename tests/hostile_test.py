"""Every reader of the vramscope command against malformed and hostile input.

Each case must end with exit code 2 and exactly one line on stderr,
"vramscope: error: ...", naming the input; no crash or core dump, within
5 seconds (also under AddressSanitizer: scripts/test_sanitize.sh runs this
file against the build-asan binary). The limits it checks are listed in
docs/hardening.md.

Inputs: the files in tests/bad_inputs/hostile/ plus ones too big or too
special to commit (100 000-level JSON nesting, a 1 MiB line, files over a
size limit, a FIFO nothing writes to, /dev/zero, a directory), made in a
temporary folder. The tables below are data: add a reader to READERS, an
input to the lists, an expected exception to EXPECTED.
"""
import json
import os
import pathlib
import stat
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BIN = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
HOSTILE = ROOT / "tests" / "bad_inputs" / "hostile"
# Under a sanitizer the binary is 2-5 times slower: scripts/test_sanitize.sh
# sets VRAMSCOPE_TEST_TIME_FACTOR so the limit still means "does not hang".
SECONDS = 5 * float(os.environ.get("VRAMSCOPE_TEST_TIME_FACTOR", "1"))
# No case may reach the network: Hub ids fail offline.
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}


def run(args, timeout=SECONDS + 1, stdin=subprocess.DEVNULL):
    start = time.monotonic()
    p = subprocess.run([BIN, *args], capture_output=True, timeout=timeout, cwd=ROOT, env=ENV,
                       stdin=stdin)
    return p, time.monotonic() - start


def check_bad_input(args, names=None, printable=True, stdin=subprocess.DEVNULL):
    """Exit 2, one stderr line that names `names` (default: no check). With
    `printable`, the line has no control characters: text read from a file
    must not reach the terminal raw (a flag's value is the user's own)."""
    p, seconds = run(args, stdin=stdin)
    stderr = p.stderr.decode("utf-8", "replace")
    assert p.returncode >= 0, f"killed by signal {-p.returncode}: {stderr[-2000:]}"
    assert p.returncode == 2, (p.returncode, stderr[-2000:])
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr[-2000:]
    line = lines[0]
    assert line.startswith("vramscope: error: "), line
    if printable:
        assert all(c == "\t" or ord(c) >= 0x20 for c in line), f"control character in {line!r}"
    if names is not None:
        assert names in line, (names, line)
    assert seconds < SECONDS, f"{seconds:.1f} s"


# --- inputs -----------------------------------------------------------------

@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Inputs made at run time: name -> path."""
    d = tmp_path_factory.mktemp("hostile")
    out = {}

    def write(name, data):
        path = d / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        out[name] = path

    deep = 100_000
    write("deep_array.json", "[" * deep + "]" * deep)
    write("deep_object.json", '{"a":' * deep + "1" + "}" * deep)
    write("deep_unclosed.json", "[" * deep)
    write("deep_in_record.jsonl", '{"format": "vramscope-groundtruth", "x": ' + "[" * deep + "\n")
    write("long_line.txt", "a" * (1 << 20))
    write("many_lines.txt", "\n" * (1 << 20))
    skipped = json.dumps({"format": "vramscope-groundtruth", "schema_version": 1, "id": "s",
                          "status": "skipped"}) + "\n"
    write("too_many_records.jsonl", skipped * 100_001)
    # Sparse files just over a reader's size limit: cheap to make.
    for name, size in [("config_over_16mib.json", (16 << 20) + 1),
                       ("events_over_16gib.events", (16 << 30) + 1),
                       ("results_over_256mib.jsonl", (256 << 20) + 1),
                       ("thresholds_over_1mib.json", (1 << 20) + 1)]:
        path = d / name
        with open(path, "wb") as f:
            f.truncate(size)
        out[name] = path
    (d / "a_directory").mkdir()
    out["a_directory"] = d / "a_directory"
    fifo = d / "fifo_without_writer"
    os.mkfifo(fifo)
    out["fifo_without_writer"] = fifo
    out["missing_file"] = d / "does_not_exist"
    out["/dev/zero"] = pathlib.Path("/dev/zero")
    out["/dev/null"] = pathlib.Path("/dev/null")
    for name in sorted(os.listdir(HOSTILE)):
        out[name] = HOSTILE / name
    return out


GENERIC = ["empty.bin", "garbage.bin", "nul_bytes.bin", "invalid_utf8.txt", "long_line.txt",
           "many_lines.txt", "deep_array.json", "deep_object.json", "deep_unclosed.json",
           "a_directory", "fifo_without_writer", "missing_file", "/dev/zero", "/dev/null"]
SPECIFIC = {
    "estimate": ["config_huge_float.json", "config_huge_int.json", "config_max_uint64.json",
                 "config_negative.json", "config_absurd_model.json", "config_control_chars.json",
                 "config_nul_in_string.json", "config_utf16.json", "config_array_root.json",
                 "config_bad_list.json", "config_over_16mib.json"],
    "simulate": ["events_huge_id.events", "events_huge_size.events", "events_control_chars.events",
                 "events_nul.events", "events_huge_version.events", "events_over_16gib.events"],
    "validate": ["results_huge_float.jsonl", "results_huge_int.jsonl", "results_negative.jsonl",
                 "results_control_key.jsonl", "results_huge_schema.jsonl",
                 "results_not_object.jsonl", "deep_in_record.jsonl", "too_many_records.jsonl",
                 "results_over_256mib.jsonl"],
    "thresholds": ["thresholds_huge.json", "thresholds_nan.json", "thresholds_negative.json",
                   "thresholds_control_key.json", "thresholds_array.json",
                   "thresholds_over_1mib.json"],
}
# A results file with no records: validate accepts it, so --thresholds is read.
NO_RECORDS = str(ROOT / "tests" / "bad_inputs" / "hostile" / "empty.bin")
# A valid PyTorch memory snapshot, for the flags of explain, replay, compare.
SNAPSHOT = str(ROOT / "tests" / "data" / "snapshots" / "wrapped.pickle")

# reader -> the command line that reads PATH.
READERS = {
    "estimate": lambda path: ["estimate", path],
    "simulate": lambda path: ["simulate", path],
    "validate": lambda path: ["validate", path],
    "thresholds": lambda path: ["validate", NO_RECORDS, "--thresholds", path],
}
# Snapshot readers: in the loop once their command exists (`CMD --help` exits 0).
SNAPSHOT_READERS = {
    "explain": lambda path: ["explain", path],
    "replay": lambda path: ["replay", path],
    "compare": lambda path: ["compare", path, "--", "gpt2"],
}


def _command_exists(name):
    try:
        return run([name, "--help"])[0].returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


for _name, _reader in SNAPSHOT_READERS.items():
    if _command_exists(_name):
        READERS[_name] = _reader

# (reader, input) -> why it is not exit 2. Anything else must be exit 2.
NOT_AN_ERROR = {
    ("validate", "empty.bin"): "an empty results file has no records: nothing to compare",
    ("validate", "many_lines.txt"): "blank lines are skipped: no records",
    ("validate", "a_directory"): "a folder stands for its *.jsonl files: none here",
}
# (reader, input) -> known defect outside the readers this test owns.
# Each is reported; strict: once fixed, the XPASS fails until the entry goes.
_BLOCKING_FIFO = "opens a FIFO with a blocking open(): it waits for a writer forever"
KNOWN_DEFECTS = {
}

CASES = [(reader, name) for reader in READERS
         for name in GENERIC + SPECIFIC.get(reader, [])
         if (reader, name) not in NOT_AN_ERROR]


def _case_param(reader, name):
    marks = []
    if (reader, name) in KNOWN_DEFECTS:
        marks.append(pytest.mark.xfail(reason=KNOWN_DEFECTS[(reader, name)], strict=True,
                                       raises=subprocess.TimeoutExpired))
    return pytest.param(reader, name, id=f"{reader}-{name}", marks=marks)


@pytest.mark.parametrize("reader,name", [_case_param(r, n) for r, n in CASES])
def test_hostile_file_exit_2_with_one_line(made, reader, name):
    path = str(made[name])
    if (reader, name) in KNOWN_DEFECTS:  # a hang: no need to wait long for it
        run(READERS[reader](path), timeout=2)
    check_bad_input(READERS[reader](path), names=path)


@pytest.mark.parametrize("reader,name", sorted(NOT_AN_ERROR), ids=lambda x: str(x))
def test_inputs_that_are_not_errors_still_end_cleanly(made, reader, name):
    p, seconds = run(READERS[reader](str(made[name])))
    assert p.returncode == 0, p.stderr.decode("utf-8", "replace")[-2000:]
    assert seconds < SECONDS


# --- model directories: config.json plus safetensors headers ----------------

def _safetensors(header_bytes, length=None):
    n = len(header_bytes) if length is None else length
    return n.to_bytes(8, "little") + header_bytes


MODEL_DIRS = {
    "header_length_2^64-1": _safetensors(b"{}", length=(1 << 64) - 1),
    "header_past_end": _safetensors(b"{}", length=1 << 20),
    "header_deep": _safetensors(b"[" * 100_000),
    "header_garbage": _safetensors(bytes(range(256)) * 4),
    "header_huge_shape": _safetensors(
        b'{"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296], '
        b'"data_offsets": [0, 4]}}'),
    "header_control_name": _safetensors(
        b'{"w\\u001b[2J\\n": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}}'),
    "too_short": b"\x01\x02",
}


@pytest.mark.parametrize("case", sorted(MODEL_DIRS))
def test_hostile_model_directory_exit_2(tmp_path, case):
    (tmp_path / "config.json").write_text((ROOT / "data" / "models" / "gpt2.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(MODEL_DIRS[case])
    check_bad_input(["estimate", str(tmp_path)], names=str(tmp_path))


@pytest.mark.parametrize("index", [
    "[" * 100_000,
    '{"weight_map": {"w": "../../etc/passwd"}}',
    '{"weight_map": {"w\\n\\u001b": 5}}',
    '{"weight_map": "x"}',
])
def test_hostile_safetensors_index_exit_2(tmp_path, index):
    (tmp_path / "config.json").write_text((ROOT / "data" / "models" / "gpt2.json").read_text())
    (tmp_path / "model.safetensors.index.json").write_text(index)
    check_bad_input(["estimate", str(tmp_path)], names=str(tmp_path))


def test_config_json_that_is_a_fifo_in_a_model_directory(tmp_path):
    os.mkfifo(tmp_path / "config.json")
    check_bad_input(["estimate", str(tmp_path)], names=str(tmp_path))


# --- flags and names -----------------------------------------------------------

LONG = "x" * 100_000  # under Linux's 128 KiB limit on one argument
HOSTILE_VALUES = ["1e999", "-1", "18446744073709551616", "nan", "inf", "0x10", " 7", LONG,
                  "\x1b[2J", "\udcff\udcfe"]  # the last: invalid UTF-8 bytes in argv

FLAG_CASES = [
    ["estimate", "gpt2", "--batch", "{v}"],
    ["estimate", "gpt2", "--seq", "{v}"],
    ["estimate", "gpt2", "--grad-accum", "{v}"],
    ["estimate", "gpt2", "--steps", "{v}"],
    ["estimate", "gpt2", "--top", "{v}"],
    ["estimate", "gpt2", "--finetune", "lora", "--lora-rank", "{v}"],
    ["estimate", "gpt2", "--finetune", "lora", "--lora-dropout", "{v}"],
    ["estimate", "gpt2", "--precision", "{v}"],
    ["estimate", "gpt2", "--gpu", "{v}"],
    ["estimate", "gpt2", "--alloc-conf", "max_split_size_mb:{v}"],
    ["estimate", "gpt2", "--transformers-version", "{v}"],
    ["estimate", "{v}"],
    ["simulate", "examples/tiny.events", "--top", "{v}"],
    ["simulate", "examples/tiny.events", "--alloc-conf", "roundup_power2_divisions:{v}"],
    ["models", "--arch", "{v}"],
    ["gpus", "{v}"],
]
# Every other numeric flag (cli/*.cc): no negative, wrapped, saturated or
# non-finite value gets through (CheckNumericFlags in cli/output.cc, which
# covers each flag a subcommand declares). Only the numeric values: the others
# take CLI11's conversion path, tested above, and a run costs 0.15 s of CPU
# under ASan.
NUMERIC_VALUES = ["-1", "18446744073709551616", "1e999", "nan", "inf", "0x10", " 7"]
NUMERIC_FLAG_CASES = [
    ["estimate", "gpt2", "--gpus", "{v}"],
    ["estimate", "gpt2", "--gpus", "2", "--tp", "{v}"],
    ["estimate", "gpt2", "--gpus", "2", "--pp", "{v}", "--microbatches", "{v}"],
    ["fit", "gpt2", "--max-batch", "{v}"],
    ["fit", "gpt2", "--max-seq", "{v}"],
    ["plan", "gpt2", "--tokens-per-step", "{v}"],
    ["plan", "gpt2", "--top", "{v}"],
    ["sweep", "gpt2", "--batch", "{v}"],
    ["sweep", "gpt2", "--seq", "1,{v}"],
    ["explain", SNAPSHOT, "--top", "{v}"],
    ["explain", SNAPSHOT, "--device", "{v}"],
    ["replay", SNAPSHOT, "--top", "{v}"],
    ["replay", SNAPSHOT, "--device", "{v}"],
    ["compare", SNAPSHOT, "--device", "{v}", "--", "gpt2"],
    ["compare", SNAPSHOT, "--", "gpt2", "--batch", "{v}"],
    ["compare", SNAPSHOT, "--", "gpt2", "--finetune", "lora", "--lora-dropout", "{v}"],
]
FLAG_CASES += NUMERIC_FLAG_CASES


def _flag_of(case):
    at = next(k for k, a in enumerate(case) if "{v}" in a)
    return case[at - 1] if case[at - 1].startswith("--") else "ARG"


# Values the integer flags accept (CLI11 reads hexadecimal and trims blanks):
# (index in FLAG_CASES, value). Such a value may still be refused by the
# knob's own range: exit 0 or 2, in time.
_INTEGER_FLAGS = {"--batch", "--seq", "--grad-accum", "--steps", "--top", "--lora-rank",
                  "--max-batch", "--max-seq", "--gpus", "--tp", "--pp", "--tokens-per-step",
                  "--device"}
ACCEPTED = {(i, v) for i, case in enumerate(FLAG_CASES) if _flag_of(case) in _INTEGER_FLAGS
            for v in ("0x10", " 7")}
# Accepted but should not be: (index, value) -> the defect (reported).
KNOWN_FLAG_DEFECTS = {}


def _needs_snapshot(case):
    return SNAPSHOT in case


def _flag_params():
    for i, case in enumerate(FLAG_CASES):
        for v in NUMERIC_VALUES if case in NUMERIC_FLAG_CASES else HOSTILE_VALUES:
            label = v if len(v) < 20 else f"{len(v)}-chars"
            args = [a.replace("{v}", v) for a in case]
            marks = []
            if (i, v) in KNOWN_FLAG_DEFECTS:
                marks.append(pytest.mark.xfail(reason=KNOWN_FLAG_DEFECTS[(i, v)], strict=True))
            if _needs_snapshot(case) and case[0] not in READERS:
                continue  # the snapshot commands are not there yet
            flag = _flag_of(case)
            yield pytest.param(args, (i, v) in ACCEPTED, marks=marks,
                               id=f"{case[0]} {flag}={label!r}"[:80])


@pytest.mark.parametrize("args,accepted", list(_flag_params()))
def test_hostile_flag_values(args, accepted):
    if accepted:
        p, seconds = run(args)
        assert p.returncode in (0, 2), p.stderr.decode("utf-8", "replace")[-2000:]
        assert seconds < SECONDS
        return
    check_bad_input(args, printable=False)


@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=lambda v: repr(v)[:20])
def test_models_filter_matching_nothing_is_not_an_error(value):
    p, seconds = run(["models", value])
    assert p.returncode == 0, p.stderr.decode("utf-8", "replace")[-2000:]
    assert len(p.stderr.splitlines()) <= 1
    assert seconds < SECONDS


# --- standard input ---------------------------------------------------------
# A FIFO or device named on the command line is refused (it could block or
# never end), but /dev/stdin is the caller's own stream: read to its end.

def test_validate_reads_standard_input_from_a_pipe():
    record = json.dumps({"format": "vramscope-groundtruth", "schema_version": 1, "id": "s",
                         "status": "skipped"}) + "\n"
    start = time.monotonic()
    p = subprocess.run([BIN, "validate", "/dev/stdin"], input=record.encode(),
                       capture_output=True, timeout=SECONDS + 1, cwd=ROOT, env=ENV)
    assert p.returncode == 0, p.stderr.decode("utf-8", "replace")[-2000:]
    assert time.monotonic() - start < SECONDS


def test_validate_reads_standard_input_redirected_from_a_file():
    with open(HOSTILE / "empty.bin", "rb") as f:
        p = subprocess.run([BIN, "validate", "/dev/stdin"], stdin=f, capture_output=True,
                           timeout=SECONDS + 1, cwd=ROOT, env=ENV)
    assert p.returncode == 0, p.stderr.decode("utf-8", "replace")[-2000:]


def test_validate_standard_input_over_the_size_limit(made):
    with open(made["results_over_256mib.jsonl"], "rb") as f:
        check_bad_input(["validate", "/dev/stdin"], names="/dev/stdin", stdin=f)
