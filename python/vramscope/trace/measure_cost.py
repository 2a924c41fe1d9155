"""What recording costs: a 7B Llama-like training step recorded on the meta device.

    /usr/bin/python3 -m vramscope.trace.measure_cost [--steps 1] [--seq 512] [--out FILE]

Builds Llama-2-7B's shapes (32 layers, hidden 4096, MLP 11008, vocab 32000) on the
meta device, so no parameter or activation memory exists, and records `steps` AdamW
training steps of batch 1. Prints the wall time of the recording (model construction
excluded), the number of events, the file size and bytes per event, and the recorded
peak with its breakdown.
"""

import argparse
import os
import sys
import tempfile
import time

import torch

from .api import record_step
from .reference_models import Llama, llama_7b_config, lm_loss
from .replay import replay

GIB = 1 << 30


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--out", help="trace file (default: a temporary file)")
    args = parser.parse_args(argv)
    out = args.out or os.path.join(tempfile.mkdtemp(prefix="vramscope-cost-"), "llama7b.events")

    started = time.perf_counter()
    model = Llama(device="meta", **llama_7b_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.zeros(args.batch, args.seq + 1, dtype=torch.long, device="meta")
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    built = time.perf_counter()
    result = record_step(model, batch, lm_loss, optimizer, steps=args.steps, path=out)
    recorded = time.perf_counter()
    summary = replay(out)

    params = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs")
    print(f"model: Llama-like, {params / 1e9:.2f}e9 parameters, fp32, meta device; "
          f"batch {args.batch} x seq {args.seq}, AdamW, {args.steps} step(s)")
    print(f"model construction: {built - started:.2f} s")
    print(f"recording (record_step, file written): {recorded - built:.2f} s")
    print(f"events: {result.num_events}, allocations: {result.num_allocations}, "
          f"file: {result.file_bytes} bytes, {result.file_bytes / result.num_events:.1f} "
          f"bytes/event")
    print(f"recorded peak (ideal accounting): {summary.peak_live_bytes / GIB:.2f} GiB at step "
          f"{summary.peak_step} {summary.peak_phase}")
    for category, size in sorted(summary.breakdown_at_peak.items(), key=lambda kv: -kv[1]):
        print(f"  {category:<6} {size / GIB:8.2f} GiB")
    print(f"trace: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
