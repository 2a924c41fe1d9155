"""What a finished recording reports about itself."""


class RecordResult:
    """What a finished recording produced (also returned by record_step)."""

    def __init__(self, path, num_events, file_bytes, num_allocations, steps, peak_live_bytes,
                 peak_step, peak_phase):
        self.path = path
        self.num_events = num_events  # a, f, p and e records
        self.file_bytes = file_bytes
        self.num_allocations = num_allocations
        self.steps = steps  # training steps seen (forward passes after an optimizer step)
        self.peak_live_bytes = peak_live_bytes  # ideal accounting: max of the sum of live sizes
        self.peak_step = peak_step
        self.peak_phase = peak_phase

    def __repr__(self):
        return (f"RecordResult(path={self.path!r}, events={self.num_events}, "
                f"file_bytes={self.file_bytes}, peak_live_bytes={self.peak_live_bytes}, "
                f"peak_at=step {self.peak_step} {self.peak_phase})")


def summarise(path, events, file_bytes, num_allocations, steps):
    """Replays the in-memory events with ideal accounting; returns a RecordResult."""
    live = peak = 0
    peak_step, peak_phase = 0, "setup"
    step, phase = 0, "setup"
    for event in events:
        kind = event[0]
        if kind == "a":
            live += event[1].size_bytes
            if live > peak:
                peak, peak_step, peak_phase = live, step, phase
        elif kind == "f":
            live -= event[1].size_bytes
        elif kind == "p":
            step, phase = event[1], event[2]
    return RecordResult(path, len(events), file_bytes, num_allocations, steps, peak, peak_step,
                        peak_phase)
