#!/usr/bin/env python3
"""Prints one phase of an event stream, allocation by allocation, with the live total.

    python3 tools/reference/debug/seq.py TRACE STEP PHASE [MIN_BYTES]

For reading a reference trace beside the lowering's (`fidelity.py run --keep DIR` keeps
both): `+BYTES TOTAL CATEGORY OP MODULE` per allocation, `-BYTES TOTAL CATEGORY OP (BORN)`
per free of an allocation made in step/phase BORN.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from vsref import events  # noqa: E402


def main(argv):
    stream = events.read_stream(argv[0])
    want = (int(argv[1]), argv[2])
    min_bytes = int(argv[3]) if len(argv) > 3 else 0
    live, total, key = {}, 0, (0, "setup")
    for kind, x in stream.events:
        if kind == "p":
            key = x
        elif kind == "a":
            live[x.id] = x
            total += x.bytes
            if key == want and x.bytes >= min_bytes:
                print(f"+{x.bytes:>10} {total:>11} {x.category:5} {x.op[:36]:36} {x.module[-44:]}")
        elif kind == "f" and x in live:
            a = live.pop(x)
            total -= a.bytes
            if key == want and a.bytes >= min_bytes:
                print(f"-{a.bytes:>10} {total:>11} {a.category:5} {a.op[:36]:36} "
                      f"({a.step}{a.phase[0]})")


if __name__ == "__main__":
    main(sys.argv[1:])
