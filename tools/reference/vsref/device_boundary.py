"""A CPU stand-in for the host/device boundary that activation offloading crosses.

torchtune 0.6.1's OffloadActivations (training/_activation_offloading.py) needs CUDA: it
copies saved activations into pinned host tensors on a side stream and brings them back
with `.to("cuda")`. On this project's CPU machine the reference run keeps every line of
that class — the pack/unpack hooks, the forward stash of 5, the backward stash, the node
hooks that release them, the storage use-count test — and replaces only what touches the
device:

- the pinned host copy (`torch.empty_like(x, pin_memory=..., device="cpu")` then
  `copy_`) is a numpy copy, which the trace recorder does not see: host memory, as on a
  GPU machine it is not device memory;
- `host_copy.to("cuda")` makes a new tensor of the same size and contents (an allocation
  the recorder sees, as the device copy is);
- CUDA streams and events are no-ops, and `record_stream` does nothing: the CPU
  reference has one stream, so a free is never delayed by another stream's work.

What this cannot show: the caching allocator's per-stream reuse (a block freed after
`record_stream` waits for the side stream). The lowering's peak under ideal accounting
is what the comparison checks.
"""

import contextlib

import numpy as np
import torch

# Same-size integer dtypes that numpy can hold, for dtypes it cannot (bf16).
_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class _HostCopy:
    """A pinned host tensor's stand-in: holds the values outside torch's allocator."""

    def __init__(self, like):
        self.shape = tuple(like.shape)
        self.dtype = like.dtype
        self.values = None

    def copy_(self, src, non_blocking=False):
        del non_blocking
        as_int = src.detach().view(_AS_INT[src.element_size()])
        self.values = np.array(as_int.numpy(), copy=True)
        return self

    def to(self, *args, **kwargs):
        del args, kwargs
        # The device copy: one allocation of the tensor's size, as `.to("cuda")` makes.
        out = torch.empty(self.shape, dtype=self.dtype)
        out.view(_AS_INT[out.element_size()]).copy_(torch.from_numpy(self.values))
        return out


class _Stream:
    def record_event(self):
        return object()

    def wait_event(self, event):
        del event

    def wait_stream(self, stream):
        del stream


@contextlib.contextmanager
def cpu_device_boundary():
    """Patches torch so that OffloadActivations runs on CPU, as described above."""
    saved = (torch.cuda.default_stream, torch.cuda.Stream, torch.cuda.stream, torch.empty_like,
             torch.Tensor.record_stream)
    empty_like = torch.empty_like

    def host_empty_like(x, *args, **kwargs):
        if "pin_memory" in kwargs and str(kwargs.get("device")) == "cpu":
            return _HostCopy(x)
        return empty_like(x, *args, **kwargs)

    torch.cuda.default_stream = lambda *a, **k: _Stream()
    torch.cuda.Stream = lambda *a, **k: _Stream()
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.empty_like = host_empty_like
    torch.Tensor.record_stream = lambda self, stream: None
    try:
        yield
    finally:
        (torch.cuda.default_stream, torch.cuda.Stream, torch.cuda.stream, torch.empty_like,
         torch.Tensor.record_stream) = saved
