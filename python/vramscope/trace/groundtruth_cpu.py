"""Ground truth without a GPU: the recorder's peak against PyTorch's CPU allocator.

For each reference model, two training steps run on CPU with both the recorder and
torch.profiler(profile_memory=True) active. The profiler reports every allocation and
free of c10's CPU allocator together with the allocator's own running total of live
bytes ("total_allocated"); the measured peak is the largest total inside the recording
window. The recorder's peak is the trace file replayed with ideal accounting. The two
mechanisms share nothing: one counts bytes in the allocator, the other storage sizes
seen by a dispatch mode.

    /usr/bin/python3 -m vramscope.trace.groundtruth_cpu [--out-dir DIR] [--json FILE]
                                                       [--models resnet50,unet,nerf,gpt]

prints one row per model; --out-dir keeps the traces, --json writes
{model: {"trace": path, "measured_peak_bytes": int, ...}} for a CI comparison with
`vramscope simulate TRACE --alloc-conf ideal:True --json`.
"""

import argparse
import gc
import json
import os
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from . import api
from ._torch_compat import untyped_storage
from .allocator_profile import measure_peaks
from .reference_models import GROUND_TRUTH_MODELS, build
from .replay import replay


def _marker():
    """A profiler marker that allocates nothing (torch.profiler.record_function does in 1.13)."""
    autograd = torch._C._autograd
    if hasattr(autograd, "_record_function_with_args_enter"):
        enter = autograd._record_function_with_args_enter
        leave = autograd._record_function_with_args_exit

        def mark(name):
            leave(enter(name))

        return mark

    def mark(name):  # torch 2.x: returns a ScriptObject, no tensor
        handle = torch.ops.profiler._record_function_enter_new(name, None)
        torch.ops.profiler._record_function_exit._RecordFunction(handle)

    return mark


def _unique_storage_bytes(tensors):
    seen = {}
    for tensor in tensors:
        storage = untyped_storage(tensor)
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _batch_tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _batch_tensors(item)


def measure(name, trace_path, steps=2, builder=build):
    """Runs `steps` CPU training steps of reference model `name`; returns a result dict.

    builder(name, device) -> (model, (inputs, target), loss_fn, optimizer); the default
    builds the reference models.
    """
    mark = _marker()
    gc.collect()
    torch.manual_seed(0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model, batch, loss_fn, optimizer = builder(name, "cpu")
        inputs, target = batch
        gc.collect()
        resident_bytes = _unique_storage_bytes(
            list(model.parameters()) + list(model.buffers()) + list(_batch_tensors(batch)))
        mark("vramscope:window-start")
        with api.record(trace_path, model=model, optimizer=optimizer, inputs=batch) as rec:
            for step in range(1, steps + 1):
                optimizer.zero_grad(set_to_none=True)
                mark(f"vramscope:{step}:forward")
                output = api._call_model(model, inputs)
                loss = loss_fn(output, target)
                mark(f"vramscope:{step}:backward")
                loss.backward()
                del output, loss
                mark(f"vramscope:{step}:optimizer")
                optimizer.step()
        mark("vramscope:window-end")
        # Free everything inside the session: the CPU allocator's running total only
        # goes down for frees it sees while profiling.
        del model, batch, inputs, target, loss_fn, optimizer, rec
        gc.collect()

    measured = measure_peaks(prof, "vramscope:window-start", "vramscope:window-end",
                             "vramscope:")
    recorded = replay(trace_path)

    def phase_text(phase):
        return f"{phase[0]}:{phase[1]}" if phase else ""

    return {
        "trace": os.path.abspath(trace_path),
        # What the CPU allocator counted, kernel scratch included.
        "measured_peak_bytes": int(measured.allocator_peak_bytes),
        "measured_peak_phase": phase_text(measured.allocator_peak_phase),
        "measured_peak_op": measured.allocator_peak_op,
        # The same without buffers allocated and freed inside one ATen op.
        "measured_op_level_peak_bytes": int(measured.op_level_peak_bytes),
        "measured_op_level_peak_phase": phase_text(measured.op_level_peak_phase),
        "kernel_scratch_peak_bytes": int(measured.scratch_peak_bytes),
        "recorded_peak_bytes": int(recorded.peak_live_bytes),
        "recorded_peak_phase": f"{recorded.peak_step}:{recorded.peak_phase}",
        "relative_error": (recorded.peak_live_bytes - measured.allocator_peak_bytes)
        / measured.allocator_peak_bytes,
        "op_level_relative_error": (recorded.peak_live_bytes - measured.op_level_peak_bytes)
        / measured.op_level_peak_bytes,
        "live_at_start_measured_bytes": int(measured.live_at_start_bytes),
        "live_at_start_expected_bytes": int(resident_bytes),
        "measured_allocations": measured.num_allocations,
        "recorded_allocations": recorded.num_allocations,
        "events": recorded.num_events,
        "file_bytes": os.path.getsize(trace_path),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", help="directory for the traces (default: a temporary one)")
    parser.add_argument("--json", help="write the results as JSON to this file")
    parser.add_argument("--models", default=",".join(GROUND_TRUTH_MODELS),
                        help="comma-separated subset of " + ",".join(GROUND_TRUTH_MODELS))
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="vramscope-groundtruth-")
    os.makedirs(out_dir, exist_ok=True)
    results = {}
    header = (f"{'model':<9} {'allocator peak':>15} {'op-level peak':>15} {'recorded peak':>15} "
              f"{'err vs op-level':>15} {'err vs allocator':>16} {'peak phase (meas/rec)':>22} "
              f"{'events':>7} {'B/event':>7}")
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, "
          f"{args.steps} training steps each; bytes")
    print(header)
    for name in args.models.split(","):
        result = measure(name, os.path.join(out_dir, f"{name}.events"), steps=args.steps)
        results[name] = result
        phases = f"{result['measured_op_level_peak_phase']}/{result['recorded_peak_phase']}"
        print(f"{name:<9} {result['measured_peak_bytes']:>15,} "
              f"{result['measured_op_level_peak_bytes']:>15,} {result['recorded_peak_bytes']:>15,} "
              f"{result['op_level_relative_error']:>+15.4%} {result['relative_error']:>+16.4%} "
              f"{phases:>22} {result['events']:>7} "
              f"{result['file_bytes'] / max(result['events'], 1):>7.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    print(f"traces in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
