"""Replays an event-stream file with ideal accounting (no allocator rounding, no caching).

live bytes = sum of the sizes of live allocations; peak = its maximum. This is what
`vramscope simulate TRACE --alloc-conf ideal:True` reports as peak_allocated_bytes, and
what the ground-truth comparison against PyTorch's CPU allocator uses.
"""

CATEGORIES = ("param", "grad", "optim", "act", "loss", "temp", "comm", "work", "other")
_LONG_NAMES = {"parameters": "param", "gradients": "grad", "optimizer_state": "optim",
               "activations": "act", "temporaries": "temp", "communication": "comm",
               "workspace": "work"}
PHASES = ("setup", "forward", "backward", "optimizer")


class ReplaySummary:
    def __init__(self):
        self.peak_live_bytes = 0
        self.peak_step = 0
        self.peak_phase = "setup"
        self.breakdown_at_peak = {}  # category token -> live bytes at the peak
        self.phase_peaks = {}  # (step, phase) -> peak live bytes within that phase
        self.final_live_bytes = 0
        self.num_allocations = 0
        self.num_frees = 0
        self.num_events = 0


def replay(path):
    """Reads `path` and returns a ReplaySummary; raises ValueError('FILE:LINE: ...') on bad input."""
    summary = ReplaySummary()
    live = {}  # id -> (size, category)
    by_category = dict.fromkeys(CATEGORIES, 0)
    live_bytes = 0
    step, phase = 0, "setup"
    with open(path, encoding="utf-8") as f:
        first = f.readline().rstrip("\r\n")
        if first.split() != ["vramscope-events", "1"]:
            raise ValueError(f"{path}:1: not a version-1 event stream: {first[:40]!r}")
        for number, line in enumerate(f, start=2):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            kind = fields[0]
            try:
                if kind == "a":
                    alloc_id, size = int(fields[1]), int(fields[2])
                    cat = _LONG_NAMES.get(fields[3], fields[3])
                    if cat not in by_category or alloc_id in live or size < 0:
                        raise ValueError("bad allocation")
                    live[alloc_id] = (size, cat)
                    live_bytes += size
                    by_category[cat] += size
                    summary.num_allocations += 1
                    key = (step, phase)
                    if live_bytes > summary.phase_peaks.get(key, -1):
                        summary.phase_peaks[key] = live_bytes
                    if live_bytes > summary.peak_live_bytes:
                        summary.peak_live_bytes = live_bytes
                        summary.peak_step, summary.peak_phase = step, phase
                        summary.breakdown_at_peak = {k: v for k, v in by_category.items() if v}
                elif kind == "f":
                    size, cat = live.pop(int(fields[1]))
                    live_bytes -= size
                    by_category[cat] -= size
                    summary.num_frees += 1
                elif kind == "p":
                    step, phase = int(fields[1]), fields[2]
                    if phase not in PHASES:
                        raise ValueError("unknown phase")
                    summary.phase_peaks.setdefault((step, phase), live_bytes)
                elif kind not in ("s", "meta", "e"):
                    raise ValueError("unknown record")
            except (ValueError, IndexError, KeyError) as error:
                raise ValueError(f"{path}:{number}: {error}: {line.strip()[:80]!r}") from None
            if kind in ("a", "f", "p", "e"):
                summary.num_events += 1
    summary.final_live_bytes = live_bytes
    return summary
