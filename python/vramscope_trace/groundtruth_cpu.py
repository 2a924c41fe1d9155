"""Ground truth without a GPU: the recorder's peak against PyTorch's CPU allocator.

For each reference model, two training steps run on CPU with both the recorder and
torch.profiler(profile_memory=True) active. The profiler reports every allocation and
free of c10's CPU allocator together with the allocator's own running total of live
bytes ("total_allocated"); the measured peak is the largest total inside the recording
window. The recorder's peak is the trace file replayed with ideal accounting. The two
mechanisms share nothing: one counts bytes in the allocator, the other storage sizes
seen by a dispatch mode.

    /usr/bin/python3 -m vramscope_trace.groundtruth_cpu [--out-dir DIR] [--json FILE]
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


def _walk(nodes):
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def _unique_storage_bytes(tensors):
    seen = {}
    for tensor in tensors:
        seen[tensor.storage().data_ptr()] = tensor.storage().nbytes()
    return sum(seen.values())


def _batch_tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _batch_tensors(item)


def measure(name, trace_path, steps=2):
    """Runs `steps` CPU training steps of reference model `name`; returns a result dict."""
    mark = _marker()
    gc.collect()
    torch.manual_seed(0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model, batch, loss_fn, optimizer = build(name, "cpu")
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

    # The profiler's view: allocator totals and our markers, in time order.
    tree = prof.profiler.kineto_results.experimental_event_tree()
    timeline = []
    for node in _walk(tree):
        if node.name.startswith("vramscope:"):
            timeline.append((node.start_time_ns, 0, node.name, None))
        elif type(node.extra_fields).__name__ == "_ExtraFields_Allocation":
            fields = node.extra_fields
            if fields.device.type == "cpu":
                op = node.parent.name if node.parent is not None else "(no op)"
                timeline.append((node.start_time_ns, 1, fields, op))
    timeline.sort(key=lambda item: (item[0], item[1]))
    # total_allocated is process-wide; what was live before this session is an offset.
    first = next((fields for _, kind, fields, _ in timeline if kind == 1), None)
    offset = first.total_allocated - first.alloc_size if first is not None else 0
    live_at_start = None
    live = 0
    phase = (0, "setup")
    measured_peak, measured_phase, measured_op = 0, phase, ""
    for _, kind, value, op in timeline:
        if kind == 0:
            if value == "vramscope:window-start":
                live_at_start = live
                measured_peak = live
            elif value == "vramscope:window-end":
                break
            else:
                _, step, phase_name = value.split(":")
                phase = (int(step), phase_name)
            continue
        live = value.total_allocated - offset
        if live_at_start is not None and live > measured_peak:
            measured_peak, measured_phase, measured_op = live, phase, op
    recorded = replay(trace_path)
    error = (recorded.peak_live_bytes - measured_peak) / measured_peak
    return {
        "trace": os.path.abspath(trace_path),
        "measured_peak_bytes": int(measured_peak),
        "measured_peak_phase": f"{measured_phase[0]}:{measured_phase[1]}",
        "measured_peak_op": measured_op,
        "recorded_peak_bytes": int(recorded.peak_live_bytes),
        "recorded_peak_phase": f"{recorded.peak_step}:{recorded.peak_phase}",
        "relative_error": error,
        "live_at_start_measured_bytes": int(live_at_start or 0),
        "live_at_start_expected_bytes": int(resident_bytes),
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
    header = (f"{'model':<10} {'measured peak B':>16} {'recorded peak B':>16} {'error':>9} "
              f"{'measured at':>14} {'recorded at':>14} {'events':>8} {'B/event':>8}")
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads, "
          f"{args.steps} training steps each")
    print(header)
    for name in args.models.split(","):
        result = measure(name, os.path.join(out_dir, f"{name}.events"), steps=args.steps)
        results[name] = result
        print(f"{name:<10} {result['measured_peak_bytes']:>16,} {result['recorded_peak_bytes']:>16,} "
              f"{result['relative_error']:>+9.4%} {result['measured_peak_phase']:>14} "
              f"{result['recorded_peak_phase']:>14} {result['events']:>8} "
              f"{result['file_bytes'] / max(result['events'], 1):>8.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    print(f"traces in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
