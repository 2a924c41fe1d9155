"""Makes a gloo run's frees happen at the same point every time, so its trace is exact.

ProcessGroupGloo runs each collective on a worker thread that holds a reference to the
collective's tensors (its AsyncWork) until it has finished that piece of work and moved
on (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, runLoop). The caller's wait()
returns when the result is ready, which can be before the worker drops its reference,
so a buffer the caller then drops is freed at once in one run and a few allocations
later in the next (docs/fidelity.md). Two changes remove the race, and neither allocates:

- every gloo process group gets one worker thread (ProcessGroupGloo._Options._threads
  = 1, torch 2.13; the default is 2), so the worker takes work in order;
- each collective called through torch.distributed is waited for and followed by a
  barrier on the same group: the barrier runs on that one worker after the collective's
  loop iteration has ended, so the worker holds nothing once the barrier returns.

On a GPU, NCCL work holds its tensors until the stream is done with them, which the
lowering models with its own rules (record_stream, docs/parallel.md); this only fixes the
reference's free times to "as soon as the collective returns".
"""

import functools
import inspect

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def _collectives():
    """Every collective torch.distributed exposes (each takes `async_op`), barrier aside.

    Read from the signatures, not listed by hand: torch 2.13's FSDP2 calls
    `all_gather_single` / `reduce_scatter_single` (fsdp/_fully_shard/_fsdp_collectives.py),
    names a hand-written list once missed, leaving FSDP2's buffers freed at the worker's
    pace. FSDP, DDP's Python side and DeepSpeed's comm backend (deepspeed/comm/torch.py)
    all call them by attribute at call time, so replacing the attribute reaches them."""
    names = []
    for name in dir(dist):
        function = getattr(dist, name, None)
        if name == "barrier" or name.startswith("__") or not callable(function):
            continue
        try:
            if "async_op" in inspect.signature(function).parameters:
                names.append(name)
        except (TypeError, ValueError):
            continue
    return names


def _one_thread_gloo():
    base = c10d.ProcessGroupGloo

    class OneThreadGloo(base):
        def __init__(self, store, rank, size, timeout=None, **_):
            options = base._Options()
            if timeout is not None:
                options._timeout = timeout
            options._devices = [base.create_default_device()]
            options._threads = 1
            super().__init__(store, rank, size, options)

    return OneThreadGloo


def _drained(original):
    try:
        names = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        names = []
    group_index = names.index("group") if "group" in names else None

    @functools.wraps(original)
    def collective(*args, **kwargs):
        work = original(*args, **kwargs)
        if work is not None and hasattr(work, "wait"):
            work.wait()
        group = kwargs.get("group")
        if group is None and group_index is not None and group_index < len(args):
            group = args[group_index]
        dist.barrier(group=group)
        return work

    return collective


def install():
    """Call before init_process_group (and before deepspeed.init_distributed)."""
    if getattr(c10d, "_vsref_ordered", False):
        return
    c10d.ProcessGroupGloo = _one_thread_gloo()
    for name in _collectives():
        setattr(dist, name, _drained(getattr(dist, name)))
    c10d._vsref_ordered = True
