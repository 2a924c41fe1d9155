"""Plain-text summary of result files (measure.py --summarize FILE...)."""

from __future__ import annotations

import json

from . import schema

GIB = float(1 << 30)


def read_records(path):
    """Returns (records, problems) from a JSONL file; bad lines become problems."""
    records, problems = [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(f"{path}:{number}: not JSON ({e})")
                continue
            errors = schema.validate_result(rec)
            if errors:
                problems.append(f"{path}:{number}: invalid record: {'; '.join(errors[:5])}")
                continue
            records.append(rec)
    return records, problems


def _gib(value):
    return "-" if value is None else f"{value / GIB:.2f}"


def format_table(records):
    header = (f"{'id':<12} {'status':<7} {'model':<18} {'b':>2} {'seq':>5} {'precision':<10} "
              f"{'optimizer':<13} {'ft':<5} {'ckpt':<9} {'attn':<5} {'alloc':>7} {'resvd':>7} "
              f"{'device':>7} {'wall':>6}")
    lines = [header, "-" * len(header)]
    for rec in records:
        k = rec["knobs"]
        mem = rec.get("memory") or {}
        wall = (rec.get("timing") or {}).get("wall_s")
        lines.append(
            f"{rec['id']:<12} {rec['status']:<7} {k['model'][:18]:<18} {k['batch']:>2} {k['seq']:>5} "
            f"{k['precision']:<10} {k['optimizer'][:13]:<13} {k['finetune']:<5} {k['grad_ckpt']:<9} "
            f"{k['attn']:<5} {_gib(mem.get('peak_allocated_bytes')):>7} "
            f"{_gib(mem.get('peak_reserved_bytes')):>7} {_gib(mem.get('peak_device_used_bytes')):>7} "
            f"{'-' if wall is None else f'{wall:.0f}s':>6}")
        if rec["status"] in ("skipped", "error") and rec.get("reason"):
            lines.append(f"{'':<12} reason: {rec['reason'].splitlines()[0][:150]}")
    return "\n".join(lines)


def summarize(paths):
    """Text summary of one or more JSONL result files (GiB = 2^30 bytes)."""
    out = []
    for path in paths:
        try:
            records, problems = read_records(path)
        except OSError as e:
            out.append(f"{path}: cannot read: {e}")
            continue
        counts = {s: sum(r["status"] == s for r in records) for s in schema.STATUSES}
        wall = sum((r.get("timing") or {}).get("wall_s") or 0 for r in records)
        out.append(f"== {path}: {len(records)} record(s): "
                   + ", ".join(f"{n} {s}" for s, n in counts.items())
                   + f"; worker time {wall:.0f} s; sizes in GiB (2^30 bytes)")
        out.append(format_table(records))
        out.extend(problems)
        out.append("")
    return "\n".join(out)
