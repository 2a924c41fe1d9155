"""Measured CPU memory from torch.profiler(profile_memory=True): the independent side.

The profiler receives one record per allocation and per free from c10's CPU allocator,
each with the pointer, the byte count requested (c10's DefaultCPUAllocator reports
`nbytes` unrounded; the 64-byte alignment of posix_memalign is not included) and the
allocator's running total of live bytes. This module turns those records into:

- the allocator peak: the largest running total inside a window;
- the op-level peak: the same total without *kernel scratch*, i.e. buffers allocated and
  released inside one ATen op that is called below autograd (oneDNN's reorder buffers in
  convolution backward, slow_conv2d's column buffers). No observer at the ATen op
  boundary can see those; vramscope's event stream does not contain them (on GPU the
  simulator models workspaces separately).

Which op is "called below autograd" is decided from the dispatcher's registry: an op
without a CompositeImplicitAutograd kernel. Composite ops (conv2d, linear, matmul,
cross_entropy) decompose before autograd, so their sub-ops are visible at the boundary.

Markers: zero-length profiler ranges named by the caller (e.g. "vramscope:1:forward")
split the timeline into phases; `window_start` and `window_end` bound the measurement.
Works with torch 1.13 (kineto event tree with _ExtraFields_Allocation) and 2.x.
"""

import functools

import torch


def _walk(nodes):
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


@functools.lru_cache(maxsize=None)
def _is_composite_implicit(name):
    """True if some overload of profiler op `name` ("aten::linear") decomposes before autograd."""
    if not name.startswith("aten::"):
        return True  # autograd nodes, record_function ranges, engine frames: not ops
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    packet = getattr(torch.ops.aten, name[len("aten::"):], None)
    overloads = packet.overloads() if packet is not None else []
    for overload in overloads or ["default"]:
        qualified = name if overload == "default" else f"{name}.{overload}"
        try:
            if has_kernel(qualified, "CompositeImplicitAutograd"):
                return True
        except RuntimeError:
            continue
    return False


def _boundary_op(node):
    """The outermost enclosing ATen op that runs below autograd (None if there is none)."""
    found = None
    parent = node.parent
    while parent is not None:
        if parent.name.startswith("aten::") and not _is_composite_implicit(parent.name):
            found = parent
        parent = parent.parent
    return found


class MeasuredPeaks:
    def __init__(self):
        self.allocator_peak_bytes = 0
        self.allocator_peak_phase = None  # (step, phase name)
        self.allocator_peak_op = ""
        self.op_level_peak_bytes = 0
        self.op_level_peak_phase = None
        self.live_at_start_bytes = 0
        self.scratch_peak_bytes = 0  # largest amount of kernel scratch live at once
        self.num_allocations = 0


def measure_peaks(prof, window_start, window_end, marker_prefix):
    """Analyses a finished profiler run; returns MeasuredPeaks for the window.

    Markers named `marker_prefix + "STEP:PHASE"` start phases. Totals are relative to
    what the allocator counted before the session began.
    """
    tree = prof.profiler.kineto_results.experimental_event_tree()
    timeline = []  # (time_ns, order, kind, payload)
    for node in _walk(tree):
        if node.name.startswith(marker_prefix):
            timeline.append((node.start_time_ns, 0, "mark", node.name))
        elif type(node.extra_fields).__name__ == "_ExtraFields_Allocation":
            if node.extra_fields.device.type == "cpu":
                timeline.append((node.start_time_ns, 1, "mem", node))
    timeline.sort(key=lambda item: (item[0], item[1]))

    # Pass 1: match frees to allocations by pointer; find kernel scratch.
    open_allocs = {}  # ptr -> (node, boundary op end time or None)
    scratch = set()  # ids of allocation and free nodes that are scratch
    for time_ns, _, kind, node in timeline:
        if kind != "mem":
            continue
        fields = node.extra_fields
        if fields.alloc_size > 0:
            boundary = _boundary_op(node)
            open_allocs[fields.ptr] = (node, boundary.end_time_ns if boundary else None)
        else:
            opened = open_allocs.pop(fields.ptr, None)
            if opened is not None and opened[1] is not None and time_ns <= opened[1]:
                scratch.add(id(opened[0]))
                scratch.add(id(node))

    # Pass 2: running totals.
    result = MeasuredPeaks()
    first = next((payload for _, _, kind, payload in timeline if kind == "mem"), None)
    offset = first.extra_fields.total_allocated - first.extra_fields.alloc_size if first else 0
    live = scratch_live = 0
    in_window = False
    phase = (0, "setup")
    for _, _, kind, payload in timeline:
        if kind == "mark":
            if payload == window_start:
                in_window = True
                result.live_at_start_bytes = live
                result.allocator_peak_bytes = live
                result.op_level_peak_bytes = live - scratch_live
                result.allocator_peak_phase = result.op_level_peak_phase = phase
            elif payload == window_end:
                in_window = False
            elif in_window:
                step, phase_name = payload[len(marker_prefix):].split(":")
                phase = (int(step), phase_name)
            continue
        fields = payload.extra_fields
        live = fields.total_allocated - offset
        if id(payload) in scratch:
            scratch_live += fields.alloc_size
        if not in_window:
            continue
        if fields.alloc_size > 0:
            result.num_allocations += 1
        if live > result.allocator_peak_bytes:
            result.allocator_peak_bytes = live
            result.allocator_peak_phase = phase
            result.allocator_peak_op = payload.parent.name if payload.parent else ""
        if live - scratch_live > result.op_level_peak_bytes:
            result.op_level_peak_bytes = live - scratch_live
            result.op_level_peak_phase = phase
        result.scratch_peak_bytes = max(result.scratch_peak_bytes, scratch_live)
    return result
