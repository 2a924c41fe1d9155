"""An independent checker of docs/event-stream.md (version 1), written from the document.

It does not share code with the recorder's writer or replay, so a test that passes
both agrees with the document rather than with itself.
"""

import re

PHASES = {"setup", "forward", "backward", "optimizer"}
CATEGORIES = {"param", "grad", "optim", "act", "loss", "temp", "comm", "work", "other",
              "parameters", "gradients", "optimizer_state", "activations", "temporaries",
              "communication", "workspace"}
_UINT = re.compile(r"[0-9]+\Z")
MAX_BYTES = 2 ** 62
MAX_ID = 2 ** 64 - 1


class Checked:
    def __init__(self):
        self.events = 0  # a, f, p, e records
        self.allocs = 0
        self.frees = 0
        self.phases = []  # (step, phase) in file order
        self.meta = {}
        self.strings = {}
        self.peak_live_bytes = 0
        self.peak_at = (0, "setup")
        self.final_live_bytes = 0
        self.categories = {}  # category -> bytes allocated in total


def _uint(token, what, line_no):
    if not _UINT.match(token):
        raise ValueError(f"line {line_no}: {what} {token!r} is not an unsigned integer")
    return int(token)


def check_text(text):
    """Raises ValueError('line N: problem') for the first violation; returns Checked."""
    checked = Checked()
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    if not lines or lines[0].rstrip("\r") != "vramscope-events 1":
        raise ValueError("line 1: header must be exactly 'vramscope-events 1'")
    live = {}
    live_bytes = 0
    step, phase = 0, "setup"
    next_string = 1
    for line_no, raw in enumerate(lines[1:], start=2):
        if len(raw.encode("utf-8")) > 65536:
            raise ValueError(f"line {line_no}: longer than 65536 bytes")
        line = raw[:-1] if raw.endswith("\r") else raw
        tokens = line.split()
        if not tokens or tokens[0].startswith("#"):
            continue
        kind = tokens[0]
        if kind == "meta":
            if len(tokens) < 3:
                raise ValueError(f"line {line_no}: meta needs KEY and VALUE")
            checked.meta[tokens[1]] = line.split(None, 2)[2]
        elif kind == "s":
            if len(tokens) < 3:
                raise ValueError(f"line {line_no}: s needs INDEX and TEXT")
            index = _uint(tokens[1], "string index", line_no)
            if index != next_string:
                raise ValueError(f"line {line_no}: string index {index}, expected {next_string}")
            checked.strings[index] = line.split(None, 2)[2]
            next_string += 1
        elif kind == "p":
            if len(tokens) != 3:
                raise ValueError(f"line {line_no}: p takes STEP PHASE")
            step = _uint(tokens[1], "step", line_no)
            phase = tokens[2]
            if phase not in PHASES:
                raise ValueError(f"line {line_no}: unknown phase {phase!r}")
            checked.phases.append((step, phase))
            checked.events += 1
        elif kind == "a":
            if not 4 <= len(tokens) <= 7:
                raise ValueError(f"line {line_no}: a takes ID BYTES CATEGORY [OP [MODULE [STREAM]]]")
            alloc_id = _uint(tokens[1], "id", line_no)
            size = _uint(tokens[2], "bytes", line_no)
            if alloc_id > MAX_ID:
                raise ValueError(f"line {line_no}: id above 2^64-1")
            if size > MAX_BYTES:
                raise ValueError(f"line {line_no}: size above 2^62")
            if tokens[3] not in CATEGORIES:
                raise ValueError(f"line {line_no}: unknown category {tokens[3]!r}")
            for token, what in zip(tokens[4:6], ("op", "module")):
                index = _uint(token, what, line_no)
                if index != 0 and index not in checked.strings:
                    raise ValueError(f"line {line_no}: {what} string {index} not defined")
            if len(tokens) == 7:
                _uint(tokens[6], "stream", line_no)
            if alloc_id in live:
                raise ValueError(f"line {line_no}: id {alloc_id} is still live")
            live[alloc_id] = size
            live_bytes += size
            checked.categories[tokens[3]] = checked.categories.get(tokens[3], 0) + size
            if live_bytes > checked.peak_live_bytes:
                checked.peak_live_bytes = live_bytes
                checked.peak_at = (step, phase)
            checked.allocs += 1
            checked.events += 1
        elif kind == "f":
            if len(tokens) != 2:
                raise ValueError(f"line {line_no}: f takes ID")
            alloc_id = _uint(tokens[1], "id", line_no)
            if alloc_id not in live:
                raise ValueError(f"line {line_no}: free of id {alloc_id} that is not live")
            live_bytes -= live.pop(alloc_id)
            checked.frees += 1
            checked.events += 1
        elif kind == "e":
            if len(tokens) != 1:
                raise ValueError(f"line {line_no}: e takes no fields")
            checked.events += 1
        else:
            raise ValueError(f"line {line_no}: unknown record {kind!r}")
    if checked.events > 2 ** 31:
        raise ValueError("more than 2^31 events")
    checked.final_live_bytes = live_bytes
    return checked


def check_file(path):
    with open(path, "rb") as f:
        data = f.read()
    return check_text(data.decode("utf-8"))
