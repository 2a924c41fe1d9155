"""The GPU a check runs on, and its memory counters (for vramscope.check and the Trainer
callback).

A reader has max_memory_allocated(), max_memory_reserved() and reset_peak_memory_stats()
(torch.cuda's peak counters of PyTorch's caching allocator), and may have mem_get_info()
-> (free, total) bytes of the whole device (cudaMemGetInfo: what nvidia-smi shows, the
CUDA context and other processes included), memory_reserved() and get_device_name(). A
reader without the optional ones measures peaks only. `CudaMemory` is torch.cuda for one
device; `reader_for` returns None where CUDA is absent, after one warning, so a check on a
CPU run predicts but never touches torch.cuda (whose counters raise there: torch 2.13's
reset_peak_memory_stats calls torch._C._cuda_resetPeakMemoryStats, absent from CPU builds).
"""

from __future__ import annotations

import warnings


class CheckWarning(UserWarning):
    """The memory check cannot do part of its work (no CUDA, an unknown GPU, no prediction);
    training goes on."""


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """A CheckWarning, once per process and message (a callback runs on every train())."""
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, CheckWarning, stacklevel=3)


class CudaMemory:
    """torch.cuda's counters for one device."""

    def __init__(self, device=None):
        import torch
        self._cuda = torch.cuda
        self.device = self._cuda.current_device() if device is None else device

    def max_memory_allocated(self) -> int:
        return self._cuda.max_memory_allocated(self.device)

    def max_memory_reserved(self) -> int:
        return self._cuda.max_memory_reserved(self.device)

    def memory_reserved(self) -> int:
        return self._cuda.memory_reserved(self.device)

    def reset_peak_memory_stats(self) -> None:
        self._cuda.reset_peak_memory_stats(self.device)

    def mem_get_info(self) -> tuple[int, int]:
        return self._cuda.mem_get_info(self.device)

    def get_device_name(self) -> str:
        return self._cuda.get_device_name(self.device)


def cuda_device(model=None):
    """The CUDA device `model`'s parameters are on (or None to use the current one)."""
    for param in getattr(model, "parameters", lambda: ())():
        device = getattr(param, "device", None)
        if getattr(device, "type", None) == "cuda":
            return device
        break
    return None


def reader_for(reader, model=None):
    """`reader` when given; else torch.cuda on `model`'s device; None without CUDA."""
    if reader is not None:
        return reader
    try:
        import torch
        available = torch.cuda.is_available()
    except ImportError:
        available = False
    if not available:
        warn_once("vramscope: CUDA is not available, so the memory check only predicts: "
                  "nothing is measured or recorded")
        return None
    return CudaMemory(cuda_device(model))


def device_total(reader) -> int | None:
    """The device's total memory (mem_get_info), None when the reader cannot say."""
    info = getattr(reader, "mem_get_info", None)
    return int(info()[1]) if info is not None else None


def device_used(reader) -> int | None:
    """Device memory in use now (total - free: every process, the CUDA context included)."""
    info = getattr(reader, "mem_get_info", None)
    if info is None:
        return None
    free, total = info()
    return int(total) - int(free)


def detected_gpu(reader) -> dict | None:
    """{"device_name", "total_bytes"} of the reader's device; None when it cannot say."""
    name = getattr(reader, "get_device_name", None)
    if name is None:
        return None
    return {"device_name": str(name()), "total_bytes": device_total(reader)}


def nearest_catalog_gpu(total_bytes: int | None, gpus: list[dict]) -> str | None:
    """The catalog GPU whose memory is closest to `total_bytes` (an unknown GPU's stand-in)."""
    if not total_bytes or not gpus:
        return None
    return min(gpus, key=lambda g: abs(int(g["total_bytes"]) - total_bytes))["name"]
