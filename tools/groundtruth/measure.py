#!/usr/bin/env python3
"""Measure real GPU memory of training configurations (vramscope ground truth).

    python3 tools/groundtruth/measure.py --grid GRID.toml --out RESULTS.jsonl
        [--snapshot DIR] [--only PATTERN] [--timeout-per-config S] [--time-budget S]
    python3 tools/groundtruth/measure.py --grid GRID.toml --dry-run   # plans, no GPU
    python3 tools/groundtruth/measure.py --summarize RESULTS.jsonl ...

Each configuration runs in a fresh process; see docs/groundtruth.md.
Exit codes: 0 done (OOM, skipped and failed configurations are results),
2 bad input or no usable GPU, 1 internal error.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gtlib import driver, grid, knobs, models, plan, summary  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="Measure GPU memory of training configurations (vramscope ground truth).")
    p.add_argument("--grid", type=Path, help="grid TOML file (see docs/groundtruth.md)")
    p.add_argument("--out", type=Path, help="JSON Lines output, one record per configuration")
    p.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="run configurations whose id or name matches this glob (repeatable)")
    p.add_argument("--snapshot", type=Path, metavar="DIR",
                   help="also write a PyTorch memory snapshot of step 2 as DIR/<id>.pickle")
    p.add_argument("--snapshot-only", action="append", default=[], metavar="PATTERN",
                   help="with --snapshot: only for configurations matching (repeatable)")
    p.add_argument("--snapshot-max-entries", type=int, default=20000,
                   help="allocator trace entries kept in a snapshot (default 20000)")
    p.add_argument("--snapshot-from-step", type=int, choices=(0, 1, 2), default=None,
                   help="with --snapshot: record history from this step through step 2 "
                        "(1 shows how step 1 laid out the cache step 2 reuses; 0 starts "
                        "before the setup, so model loading is in it; default 2)")
    p.add_argument("--timeout-per-config", type=float, default=600.0, metavar="S",
                   help="kill a configuration's worker after S seconds (default 600)")
    p.add_argument("--time-budget", type=float, metavar="S",
                   help="start no configuration after S seconds; --resume continues later")
    p.add_argument("--overlap", action="store_true",
                   help="start the next configuration's worker while the current one measures "
                        "(its imports overlap; it waits to touch the GPU until the current exits)")
    p.add_argument("--resume", action="store_true",
                   help="append to --out, skipping ids already recorded there")
    p.add_argument("--models-dir", action="append", type=Path, default=[], metavar="DIR",
                   help="catalog directory of <alias>.json configs (default: data/models, "
                        "tools/groundtruth/configs)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for the worker processes (default: this one)")
    p.add_argument("--dry-run", action="store_true",
                   help="print each configuration's plan (or skip reason) and exit; no GPU needed")
    p.add_argument("--list", action="store_true", help="print ids and names and exit")
    p.add_argument("--no-preflight", action="store_true",
                   help="do not check for a GPU before starting")
    p.add_argument("--summarize", nargs="+", type=Path, metavar="RESULTS",
                   help="print a summary table of result files and exit")
    return p.parse_args(argv)


def dry_run(configs, model_dirs):
    for config in configs:
        print(f"{config.id}  {config.name}")
        try:
            resolved = models.resolve_model(config.knobs["model"], model_dirs)
            the_plan = plan.make_plan(config.knobs, resolved.config)
        except (models.ModelError, plan.PlanSkip) as e:
            print(f"    skipped: {e}")
            continue
        missing = driver.missing_modules(the_plan["requires"])
        print("    vramscope estimate " + shlex.join(knobs.estimate_flags(config.knobs)))
        print("    plan: " + json.dumps(the_plan, sort_keys=True))
        if missing:
            print(f"    would be skipped here: needs {', '.join(missing)}")


def main(argv=None):
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.summarize:
        print(summary.summarize(args.summarize))
        return 0
    if args.grid is None:
        print("measure.py: --grid is required (or --summarize)", file=sys.stderr)
        return 2
    try:
        configs = grid.load_grid(args.grid)
    except grid.GridError as e:
        print(f"measure.py: {e}", file=sys.stderr)
        return 2
    configs = grid.select(configs, args.only)
    if not configs:
        print("measure.py: no configuration matches --only", file=sys.stderr)
        return 2
    model_dirs = tuple(args.models_dir) or models.DEFAULT_MODEL_DIRS
    if args.list:
        for c in configs:
            print(f"{c.id}  {c.name}")
        return 0
    if args.dry_run:
        dry_run(configs, model_dirs)
        return 0
    if args.out is None:
        print("measure.py: --out is required to measure", file=sys.stderr)
        return 2
    if args.snapshot_max_entries < 1:
        print("measure.py: --snapshot-max-entries must be >= 1", file=sys.stderr)
        return 2

    env = None
    if not args.no_preflight:
        env = driver.preflight(args.python)
        if env is None:
            print("measure.py: the worker could not start (is torch installed for "
                  f"{args.python}?)", file=sys.stderr)
            return 2
        if not env.get("gpu_present"):
            print("measure.py: no CUDA GPU visible to PyTorch; measuring needs one "
                  "(--dry-run shows the plans without a GPU)", file=sys.stderr)
            return 2
        gpu = env.get("gpu") or {}
        print(f"GPU: {gpu.get('name')}  {(gpu.get('total_memory_bytes') or 0) / (1 << 30):.1f} GiB"
              f"  torch {env.get('torch_version')}  transformers "
              f"{env['packages'].get('transformers')}  peft {env['packages'].get('peft')}"
              f"  bitsandbytes {env['packages'].get('bitsandbytes')}", file=sys.stderr)

    opts = driver.Options(
        out_path=args.out,
        timeout_s=args.timeout_per_config,
        # The budget counts from this program's start, preflight included.
        time_budget_s=None if args.time_budget is None
        else args.time_budget - (time.monotonic() - started),
        snapshot_dir=args.snapshot,
        snapshot_patterns=tuple(args.snapshot_only),
        snapshot_max_entries=args.snapshot_max_entries,
        snapshot_from_step=args.snapshot_from_step,
        resume=args.resume,
        overlap=args.overlap,
        model_dirs=model_dirs,
        python=args.python,
        command=shlex.join([Path(sys.executable).name] + sys.argv),
        env=env,
    )
    result = driver.run_configs(configs, opts)
    counts = ", ".join(f"{n} {s}" for s, n in result.counts.items())
    print(f"done in {result.elapsed_s:.0f} s: {counts}"
          + (f"; {result.already_done} already in {args.out}" if result.already_done else "")
          + (f"; {result.not_run} not run (time budget)" if result.not_run else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # output piped into `head`
        sys.stderr.close()
        sys.exit(0)
