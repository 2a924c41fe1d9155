#!/usr/bin/env python3
"""Prints what is alive at a phase's peak (or at its start or end), largest first.

    python3 tools/reference/debug/live.py TRACE STEP PHASE [peak|start|end] [ROWS]

Allocations are grouped by (op, category, size, the step and phase they were made in).
"""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from vsref import events  # noqa: E402


def snapshot(stream, want, mode):
    live, total, key, best, snap = {}, 0, (0, "setup"), -1, None
    for kind, x in stream.events:
        if kind == "p":
            if key == want and mode == "end":
                return live
            key = x
            if key == want and mode == "start":
                return live
        elif kind == "a":
            live[x.id] = x
            total += x.bytes
            if key == want and mode == "peak" and total > best:
                best, snap = total, dict(live)
        elif kind == "f" and x in live:
            total -= live.pop(x).bytes
    return snap if snap is not None else live


def main(argv):
    mode = argv[3] if len(argv) > 3 else "peak"
    rows = int(argv[4]) if len(argv) > 4 else 25
    snap = snapshot(events.read_stream(argv[0]), (int(argv[1]), argv[2]), mode)
    groups = collections.Counter()
    for a in snap.values():
        groups[(a.op, a.category, a.bytes, a.step, a.phase)] += 1
    print("total", sum(a.bytes for a in snap.values()))
    for (op, cat, size, step, phase), n in sorted(groups.items(),
                                                   key=lambda kv: -kv[0][2] * kv[1])[:rows]:
        print(f"{size * n:>11} {n:>4} x {size:>10} {cat:6} {op[:40]:40} born {step}{phase[0]}")


if __name__ == "__main__":
    main(sys.argv[1:])
