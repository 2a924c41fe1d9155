"""The measured training loop and the memory probe it reads.

Needs torch (passed in, never imported here at module level) but not
transformers, so tests drive it on CPU with a tiny model and FakeProbe.

Per phase (forward, backward, optimizer) of every step:
  begin: probe.sync(); probe.reset_peak(); read allocated/reserved
  ... the phase's work ...
  end:   probe.sync(); read peak allocated/reserved since begin,
         allocated/reserved now, and device memory in use (total - free).
"""

from __future__ import annotations

import contextlib
import time

IGNORE_INDEX = -100


class CudaProbe:
    """Reads PyTorch's CUDA caching-allocator counters and cudaMemGetInfo."""

    def __init__(self, torch):
        self.torch = torch

    def sync(self):
        self.torch.cuda.synchronize()

    def reset_peak(self):
        self.torch.cuda.reset_peak_memory_stats()

    def allocated(self):
        return int(self.torch.cuda.memory_allocated())

    def reserved(self):
        return int(self.torch.cuda.memory_reserved())

    def peak_allocated(self):
        return int(self.torch.cuda.max_memory_allocated())

    def peak_reserved(self):
        return int(self.torch.cuda.max_memory_reserved())

    def device_used(self):
        free, total = self.torch.cuda.mem_get_info()
        return int(total - free)

    def device_total(self):
        return int(self.torch.cuda.mem_get_info()[1])

    def stats(self):
        return dict(self.torch.cuda.memory_stats())

    def is_oom(self, exc):
        return is_oom_error(self.torch, exc)


def is_oom_error(torch, exc):
    """True for CUDA out-of-memory errors (torch.cuda.OutOfMemoryError or the older RuntimeError)."""
    oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


# memory_stats() keys recorded with each result (the simulator is checked against them).
ALLOCATOR_STAT_KEYS = (
    "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
    "num_sync_all_streams", "max_split_size",
    "allocated_bytes.all.peak", "reserved_bytes.all.peak", "active_bytes.all.peak",
    "inactive_split_bytes.all.peak", "requested_bytes.all.peak",
    "segment.all.peak", "segment.large_pool.peak", "segment.small_pool.peak",
    "oversize_allocations.peak", "oversize_segments.peak",
    "allocated_bytes.all.current", "reserved_bytes.all.current",
    "inactive_split_bytes.all.current",
)


def allocator_stats(stats):
    return {k: int(stats[k]) for k in ALLOCATOR_STAT_KEYS if k in stats}


class PhaseRecorder:
    """Opens and closes phases, recording the probe's readings for each one."""

    def __init__(self, probe, clock=time.perf_counter):
        self.probe = probe
        self.clock = clock
        self.phases = []
        self.current = None
        self._t0 = 0.0

    def begin(self, step, micro_batch, phase):
        assert self.current is None, "phase already open"
        self.probe.sync()
        self.probe.reset_peak()
        self.current = {
            "step": step,
            "micro_batch": micro_batch,
            "phase": phase,
            "completed": False,
            "begin_allocated_bytes": self.probe.allocated(),
            "begin_reserved_bytes": self.probe.reserved(),
        }
        self._t0 = self.clock()

    def end(self, completed=True):
        """Closes the open phase; on an exception call with completed=False."""
        assert self.current is not None, "no phase open"
        entry = self.current
        self.current = None
        try:
            self.probe.sync()
        except Exception:  # after an error the device may refuse to sync; keep the readings
            pass
        duration_ms = (self.clock() - self._t0) * 1000.0
        entry.update({
            "completed": completed,
            "peak_allocated_bytes": self.probe.peak_allocated(),
            "peak_reserved_bytes": self.probe.peak_reserved(),
            "end_allocated_bytes": self.probe.allocated(),
            "end_reserved_bytes": self.probe.reserved(),
            "end_device_used_bytes": self.probe.device_used(),
            "duration_ms": round(duration_ms, 3),
        })
        self.phases.append(entry)
        return entry


class Hooks:
    """Called around each step (the worker uses them for memory snapshots)."""

    def before_step(self, step):
        pass

    def after_step(self, step):
        pass


def train(model, optimizer, compute_loss, recorder, steps, micro_batches,
          autocast=None, scaler=None, hooks=None, backward=None, step=None):
    """Runs `steps` optimizer steps of `micro_batches` forward/backward each.

    compute_loss(): runs the forward and returns only the loss tensor; the
    model's output object (logits etc.) is not kept alive. autocast: a
    zero-argument factory of a context manager wrapping the forward only.
    backward(loss) and step() replace `loss.backward()` and the optimizer
    phase's step + zero_grad where a library owns them (DeepSpeed's
    engine.backward / engine.step, accelerate's backward). Raises whatever the
    step raises; recorder.current then names the phase.
    """
    hooks = hooks or Hooks()
    autocast = autocast or contextlib.nullcontext
    if backward is None:
        def backward(loss):
            (scaler.scale(loss) if scaler is not None else loss).backward()
    if step is None and optimizer is not None:
        def step():
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    for index in range(1, steps + 1):
        hooks.before_step(index)
        for micro in range(micro_batches):
            recorder.begin(index, micro, "forward")
            with autocast():
                loss = compute_loss()
            if micro_batches > 1:
                loss = loss / micro_batches
            recorder.end()
            recorder.begin(index, micro, "backward")
            backward(loss)
            del loss
            recorder.end()
        if step is not None:
            recorder.begin(index, None, "optimizer")
            step()
            recorder.end()
        else:
            model.zero_grad(set_to_none=True)
        hooks.after_step(index)


def hf_loss_fn(model, input_ids, labels):
    """loss = model(input_ids=..., labels=...).loss; the output object is dropped at once."""
    def compute():
        return model(input_ids=input_ids, labels=labels).loss
    return compute


def chunked_causal_loss_fn(torch, backbone, lm_head, input_ids, labels, chunks, softcap=None):
    """Causal-LM loss over the logits in `chunks` pieces (torchtune CEWithChunkedOutputLoss style).

    hidden = backbone(input_ids).last_hidden_state is flattened to (b*s, h)
    and split into `chunks` near-equal row blocks (torch.tensor_split: the
    first ones one row longer); each block goes through lm_head, optional tanh
    soft-capping (gemma2), .float() and cross_entropy(reduction="sum"). No
    checkpointing: autograd keeps each chunk's fp32 log-probabilities, but no
    full (b*s, vocab) bf16 logits tensor ever exists. Labels are shifted as
    transformers does (pad with -100, drop the first position); the summed
    loss is divided by the number of labelled tokens.
    """
    F = torch.nn.functional

    def compute():
        out = backbone(input_ids=input_ids)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        flat = hidden.reshape(-1, hidden.shape[-1])
        del out, hidden
        shifted = F.pad(labels, (0, 1), value=IGNORE_INDEX)[:, 1:].reshape(-1)
        count = (shifted != IGNORE_INDEX).sum()
        total = None
        for h_chunk, y_chunk in zip(torch.tensor_split(flat, chunks), torch.tensor_split(shifted, chunks)):
            logits = lm_head(h_chunk)
            if softcap:
                logits = torch.tanh(logits / softcap) * softcap
            part = F.cross_entropy(logits.float(), y_chunk, ignore_index=IGNORE_INDEX,
                                   reduction="sum")
            del logits
            total = part if total is None else total + part
        return total / count
    return compute
