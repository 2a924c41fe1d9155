"""What the recorder remembers about each storage, and how a category is chosen.

A category can only be chosen once a storage's whole life is known (an activation
is a forward tensor that outlives the forward phase), so records are kept in memory
and categorised when the trace is written.
"""

# Flags: facts observed about a storage while it was live.
PARAM = 1  # a module parameter or buffer (or an optimizer's parameter)
GRAD = 2  # was some parameter's .grad
OPTIM = 4  # was a value in optimizer.state
LOSS = 8  # the model's output (logits) or a tensor backward() started from
EXTERNAL = 16  # not produced by an op we saw: existed before recording or created outside ATen

# Regions: where the program was when the storage was allocated.
SETUP = 0  # before the first phase, or registered as pre-existing
FORWARD_MODEL = 1  # inside the model's forward
FORWARD_LOSS = 2  # forward phase, after the model returned (loss computation)
BACKWARD = 3  # backward phase (inside backward() or after it, e.g. gradient clipping)
OPTIMIZER_STEP = 4  # inside optimizer.step()
BETWEEN = 5  # optimizer phase, after step() returned (zero_grad, loading the next batch)

PHASE_NAMES = ("setup", "forward", "backward", "optimizer")


class AllocRecord:
    """One storage allocation: its size and everything needed to categorise it."""

    __slots__ = ("alloc_id", "size_bytes", "op", "module", "phase_index", "free_phase_index",
                 "flags", "region", "weak_ref")

    def __init__(self, alloc_id, size_bytes, op, module, phase_index, flags, region):
        self.alloc_id = alloc_id
        self.size_bytes = size_bytes
        self.op = op  # internal string id (0 = none)
        self.module = module  # internal string id (0 = none)
        self.phase_index = phase_index  # index of the `p` record it was allocated under
        self.free_phase_index = -1  # index of the `p` record it was freed under; -1 = still live
        self.flags = flags
        self.region = region
        self.weak_ref = 0  # storage weak reference while live (see storage_table.py)


def category(record):
    """The event-stream category token for a finished record.

    Observed roles win over timing: parameters, then gradients, then optimizer state,
    then loss/logits. Otherwise the lifetime decides: a storage freed in the phase that
    allocated it is a temporary; one that outlives it is an activation (forward, inside
    the model), loss (forward, after the model returned), optimizer state (inside
    optimizer.step) or other.
    """
    flags = record.flags
    if flags & PARAM:
        return "param"
    if flags & GRAD:
        return "grad"
    if flags & OPTIM:
        return "optim"
    if flags & LOSS:
        return "loss"
    freed_in_own_phase = record.free_phase_index == record.phase_index
    if flags & EXTERNAL or record.region == SETUP:
        return "temp" if freed_in_own_phase and record.region != SETUP else "other"
    if freed_in_own_phase:
        return "temp"
    region = record.region
    if region == FORWARD_MODEL:
        return "act"
    if region == FORWARD_LOSS:
        return "loss"
    if region == OPTIMIZER_STEP:
        return "optim"
    return "other"
