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

# The collectives torch.distributed exposes that FSDP, DDP's Python side and DeepSpeed's
# comm backend (deepspeed/comm/torch.py) call by attribute at call time.
_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                "reduce_scatter_tensor", "broadcast", "reduce", "all_to_all_single",
                "all_gather_coalesced", "all_reduce_coalesced", "_all_gather_base",
                "_reduce_scatter_base", "gather", "scatter")


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
    for name in _COLLECTIVES:
        original = getattr(dist, name, None)
        if original is not None:
            setattr(dist, name, _drained(original))
    c10d._vsref_ordered = True
