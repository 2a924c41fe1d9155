"""Reads vramscope event streams (docs/event-stream.md) and measures them under ideal accounting.

Ideal accounting: live bytes = the sum of the live allocations' sizes, no allocator
rounding or caching. It is what both the CPU reference (c10's CPU allocator counts
requested bytes) and `--alloc-conf ideal:True` measure, so the two streams compare on
the lowering's rules alone.
"""

import collections
import dataclasses

CATEGORIES = ("param", "grad", "optim", "act", "loss", "temp", "comm", "work", "other")


@dataclasses.dataclass
class Alloc:
    id: int
    bytes: int
    category: str
    op: str
    module: str
    step: int
    phase: str


@dataclasses.dataclass
class Stream:
    events: list  # ("a", Alloc) | ("f", id) | ("p", (step, phase)) in file order
    meta: dict


def read_stream(path):
    strings = {0: ""}
    events = []
    meta = {}
    step, phase = 0, "setup"
    with open(path, encoding="utf-8") as f:
        header = f.readline().strip()
        # Version 2 adds stream records (u, x): they move when a freed block can be
        # reused, not the allocated bytes that ideal accounting counts.
        if header not in ("vramscope-events 1", "vramscope-events 2"):
            raise ValueError(f"{path}: not a vramscope event stream (header {header!r})")
        for line in f:
            tok = line.rstrip("\n").split(" ", 2) if line.startswith(("s ", "meta ")) else line.split()
            if not tok or tok[0].startswith("#"):
                continue
            kind = tok[0]
            if kind == "s":
                strings[int(tok[1])] = tok[2]
            elif kind == "meta":
                key, _, value = tok[1].partition(" ") if len(tok) == 2 else (tok[1], "", tok[2])
                meta[key] = value
            elif kind == "p":
                step, phase = int(tok[1]), tok[2]
                events.append(("p", (step, phase)))
            elif kind == "a":
                op = strings[int(tok[4])] if len(tok) > 4 else ""
                module = strings[int(tok[5])] if len(tok) > 5 else ""
                events.append(("a", Alloc(int(tok[1]), int(tok[2]), tok[3], op, module, step, phase)))
            elif kind == "f":
                events.append(("f", int(tok[1])))
    return Stream(events, meta)


@dataclasses.dataclass
class Measure:
    phase_peaks: dict  # (step, phase) -> peak live bytes
    phase_allocs: dict  # (step, phase) -> [(bytes, op, module, category)] in order
    peak_bytes: int
    peak_at: tuple  # (step, phase)
    category_at_peak: dict  # category -> bytes
    saved_per_layer: dict  # layer index -> bytes allocated in forward alive at its end
    setup_end_bytes: int = 0  # live bytes when the first step begins


def _layer_of(module):
    parts = module.split(".")
    for i, p in enumerate(parts[:-1]):
        if p in ("layers", "layer", "h") and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None


def measure(stream, skip_categories=()):
    live = {}
    total = 0
    peaks = collections.OrderedDict()
    allocs = collections.defaultdict(list)
    key = (0, "setup")
    best = (-1, key, None)
    best_live = {}
    peaks[key] = 0
    saved = collections.Counter()
    forward_allocs = {}

    def end_of_forward():
        for a in forward_allocs.values():
            layer = _layer_of(a.module)
            if layer is not None:
                saved[layer] += a.bytes

    setup_end = None
    for kind, x in stream.events:
        if kind == "p":
            if setup_end is None:
                setup_end = total
            if key[1] == "forward" and not saved:
                end_of_forward()
            key = x
            forward_allocs.clear()
            peaks.setdefault(key, total)
            peaks[key] = max(peaks[key], total)
        elif kind == "a":
            if x.category in skip_categories:
                continue
            live[x.id] = x
            total += x.bytes
            allocs[key].append((x.bytes, x.op, x.module, x.category))
            if key[1] == "forward":
                forward_allocs[x.id] = x
            if total > peaks.get(key, 0):
                peaks[key] = total
            if total > best[0]:
                best = (total, key, None)
                best_live = dict(live)
        elif kind == "f":
            a = live.pop(x, None)
            if a is not None:
                total -= a.bytes
                forward_allocs.pop(x, None)
    cats = collections.Counter()
    for a in best_live.values():
        cats[a.category] += a.bytes
    return Measure(dict(peaks), dict(allocs), best[0], best[1], dict(cats), dict(saved),
                   total if setup_end is None else setup_end)


def first_divergence(reference, predicted):
    """The first (step, phase) and index where the two allocation sequences differ.

    Setup is left out: it lists parameters and buffers in creation order, which says
    nothing about the training step's rules (its total is compared as a phase peak)."""
    for key, ref in reference.phase_allocs.items():
        if key[1] == "setup":
            continue
        pred = predicted.phase_allocs.get(key, [])
        for i in range(max(len(ref), len(pred))):
            r = ref[i] if i < len(ref) else None
            p = pred[i] if i < len(pred) else None
            if r is None or p is None or r[0] != p[0]:
                return key, i, r, p
    return None
