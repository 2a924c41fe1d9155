"""The fidelity check: real-library traces on CPU against the lowering, point by point.

    python tools/reference/fidelity.py run --grid ci|full|ranks|... [--only SUBSTR] [--out RESULTS.json]
    python tools/reference/fidelity.py table RESULTS.json [--markdown docs/fidelity.md [--section ranks]]

`run` records every point of the grid with the real libraries (vsref.runner, inside
.venv/tf5 or .venv/tf4), lowers the same config and knobs with
`vramscope estimate --device-rules cpu --alloc-conf ideal:True --events`, measures both
streams under ideal accounting (vsref.events) and writes one result per point. `table`
renders the results as the Markdown table of docs/fidelity.md (between its markers).
"""

import argparse
import concurrent.futures
import glob
import json
import os
import subprocess
import sys
import tempfile

from . import events
from .grid import GRIDS
from .knobs import point_from_json
from .models import VAE_FAMILIES, reference_config

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
VRAMSCOPE = os.environ.get("VRAMSCOPE", os.path.join(ROOT, "build", "cli", "vramscope"))
TOLERANCE = 0.01  # of the recorded peak, for every phase peak (docs/fidelity.md)
BEGIN, END = "<!-- fidelity:begin -->", "<!-- fidelity:end -->"
# The multi-rank table (--grid ranks) has markers of its own.
SECTIONS = {"": (BEGIN, END),
            "ranks": ("<!-- fidelity-ranks:begin -->", "<!-- fidelity-ranks:end -->")}


def venv_python(tf):
    return os.path.join(ROOT, ".venv", f"tf{tf}", "bin", "python")


def record(points, workdir):
    """Records every point's reference trace; one runner process per transformers version."""
    by_tf = {}
    for p in points:
        config_path = os.path.join(workdir, _slug(p) + ".config.json")
        config = reference_config(p.family)
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=1)
        by_tf.setdefault(p.tf, []).append({"point": p.to_json(), "config": config,
                                           "out": os.path.join(workdir, _slug(p) + ".ref.events")})

    def run_jobs(tf, jobs):
        jobs_path = os.path.join(workdir, f"jobs-tf{tf}.json")
        with open(jobs_path, "w", encoding="utf-8") as f:
            json.dump(jobs, f)
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tools", "reference"),
                   HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
                   DIFFUSERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false",
                   PYTHONWARNINGS="ignore")
        subprocess.run([venv_python(tf), "-m", "vsref.runner", jobs_path], check=True, env=env)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for f in [pool.submit(run_jobs, tf, jobs) for tf, jobs in by_tf.items()]:
            f.result()


def _slug(point):
    return point.name().replace("/", "_")


def predict(point, workdir):
    config_path = os.path.join(workdir, _slug(point) + ".config.json")
    out = os.path.join(workdir, _slug(point) + ".pred.events")
    cmd = [VRAMSCOPE, "estimate", config_path, *point.estimate_args(), "--device-rules", "cpu",
           "--alloc-conf", "ideal:True", "--events", out, "--json"]
    if point.vae:
        # The reference's AutoencoderKL config (vsref/vae.py) beside the denoiser's.
        vae_path = os.path.join(workdir, _slug(point) + ".vae.json")
        with open(vae_path, "w", encoding="utf-8") as f:
            json.dump(VAE_FAMILIES[point.vae], f, indent=1)
        cmd += ["--vae", vae_path]
    for stale in glob.glob(out + ".class*"):
        os.remove(stale)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"estimate failed: {proc.stderr.strip()}")
    return out


def pred_for_rank(pred_path, rank):
    """The predicted stream of the rank class holding `rank`: `estimate --events FILE` writes
    one file per rank class when there are several (FILE, FILE.class1, ...: DeepSpeed ZeRO-1/2
    lowers each data-parallel rank, whose partition differs), each naming its ranks in a
    `meta ranks` line; one class covers every rank."""
    for path in [pred_path] + sorted(glob.glob(pred_path + ".class*")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("vramscope-events"):
                    continue
                if not line.startswith("meta "):
                    break
                key, _, value = line[5:].rstrip("\n").partition(" ")
                if key == "ranks" and str(rank) in value.split(","):
                    return path
    return pred_path


def _pct(predicted, recorded, base):
    return 100.0 * (predicted - recorded) / base if base else 0.0


def compare(point, ref_path, pred_path, name=None):
    """One point (or one rank of a multi-rank point, `name`) against its prediction.

    A multi-rank point's setup is compared at its end (live bytes as the first step
    begins): its recording starts before the library wraps the model, and on CPU the
    wrapping moves nothing between host and device, so its transients are not a GPU's
    (docs/fidelity.md, "Multi-rank points")."""
    ref = events.measure(events.read_stream(ref_path))
    pred = events.measure(events.read_stream(pred_path))
    if point.gpus > 1:
        ref.phase_peaks[(0, "setup")] = ref.setup_end_bytes
        pred.phase_peaks[(0, "setup")] = pred.setup_end_bytes
    phases = []
    for key, recorded in ref.phase_peaks.items():
        predicted = pred.phase_peaks.get(key, 0)
        phases.append({"step": key[0], "phase": key[1], "recorded_bytes": recorded,
                       "predicted_bytes": predicted,
                       "error_pct": round(_pct(predicted, recorded, ref.peak_bytes), 3)})
    worst = max(phases, key=lambda ph: abs(ph["error_pct"]))
    div = events.first_divergence(ref, pred)
    return {
        "name": name or point.name(), "point": point.to_json(),
        "recorded_peak_bytes": ref.peak_bytes, "predicted_peak_bytes": pred.peak_bytes,
        "recorded_peak_at": list(ref.peak_at), "predicted_peak_at": list(pred.peak_at),
        "peak_error_pct": round(_pct(pred.peak_bytes, ref.peak_bytes, ref.peak_bytes), 3),
        "worst_phase": f"{worst['step']}:{worst['phase']}",
        "worst_phase_error_pct": worst["error_pct"],
        "phases": phases,
        "recorded_category_at_peak": ref.category_at_peak,
        "predicted_category_at_peak": pred.category_at_peak,
        "recorded_saved_per_layer": {str(k): v for k, v in sorted(ref.saved_per_layer.items())},
        "predicted_saved_per_layer": {str(k): v for k, v in sorted(pred.saved_per_layer.items())},
        "first_divergence": _describe_divergence(div),
    }


def _describe_divergence(div):
    if div is None:
        return None
    (step, phase), index, r, p = div
    show = lambda a: "nothing" if a is None else f"{a[0]} B {a[1] or '?'} in {a[2] or '?'}"  # noqa: E731
    return f"step {step} {phase}, allocation #{index}: recorded {show(r)}, predicted {show(p)}"


def run_points(points, workdir):
    record(points, workdir)
    results = []
    for p in points:
        ref_path = os.path.join(workdir, _slug(p) + ".ref.events")
        if os.path.exists(ref_path + ".error"):
            with open(ref_path + ".error", encoding="utf-8") as f:
                results.append({"name": p.name(), "point": p.to_json(),
                                "error": "reference: " + f.read().strip()})
            continue
        try:
            pred_path = predict(p, workdir)
            if p.gpus == 1:
                results.append(compare(p, ref_path, pred_path))
            for rank in range(p.gpus if p.gpus > 1 else 0):
                # Each rank against its rank class's stream (one class for most modes).
                results.append(compare(p, f"{ref_path}.rank{rank}", pred_for_rank(pred_path, rank),
                                       f"{p.name()}/rank{rank}"))
        except (RuntimeError, OSError) as e:
            results.append({"name": p.name(), "point": p.to_json(), "error": str(e)})
    return sorted(results, key=lambda r: r["name"])


def within_tolerance(result):
    return "error" not in result and all(abs(ph["error_pct"]) <= 100 * TOLERANCE
                                         for ph in result["phases"])


def _mib(b):
    return f"{b / 2**20:.3f}"


def _phases(r):
    """Each phase's error against the recorded peak: 'setup -0.05, 1f +0.03, 1b ...'."""
    return ", ".join(("setup" if ph["phase"] == "setup" else f"{ph['step']}{ph['phase'][0]}")
                     + f" {ph['error_pct']:+.2f}" for ph in r["phases"])


def _categories(r):
    """Bytes by category at each stream's peak, recorded / predicted MiB."""
    rec, pred = r["recorded_category_at_peak"], r["predicted_category_at_peak"]
    return ", ".join(f"{c} {rec.get(c, 0) / 2**20:.2f}/{pred.get(c, 0) / 2**20:.2f}"
                     for c in sorted(set(rec) | set(pred)) if rec.get(c, 0) or pred.get(c, 0))


def markdown_table(results):
    lines = ["| point | recorded peak MiB | predicted peak MiB | peak error | worst phase error | "
             "error per phase (%) | at the peak by category, recorded / predicted MiB | first divergence |",
             "|---|---:|---:|---:|---:|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['name']} | — | — | — | — | — | — | {r['error'].splitlines()[0][:200]} |")
            continue
        mark = "" if within_tolerance(r) else " ✗"
        lines.append(
            f"| {r['name']} | {_mib(r['recorded_peak_bytes'])} | {_mib(r['predicted_peak_bytes'])} | "
            f"{r['peak_error_pct']:+.2f}% | {r['worst_phase_error_pct']:+.2f}% "
            f"({r['worst_phase']}){mark} | {_phases(r)} | {_categories(r)} | {r['first_divergence'] or 'none'} |")
    ok = sum(within_tolerance(r) for r in results)
    lines.append("")
    lines.append(f"{ok} of {len(results)} points within {100 * TOLERANCE:.0f}% of the recorded "
                 "peak in every phase.")
    return "\n".join(lines) + "\n"


def splice(markdown_path, table, section=""):
    begin, end = SECTIONS[section]
    with open(markdown_path, encoding="utf-8") as f:
        text = f.read()
    head, found, rest = text.partition(begin)
    if not found:
        raise SystemExit(f"{markdown_path}: no {begin} marker")
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{table}{end}{tail}"


GAPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "known_gaps.txt")


def shrink_gaps(results, write):
    """Reports points off by more than the tolerance that the list does not name (to
    fix, never to add) and listed points now within it; with `write`, removes those.
    Returns 1 when an unlisted point is off."""
    with open(GAPS, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    listed = {ln.split("#")[0].strip() for ln in lines} - {""}
    off = sorted(r["name"] for r in results if not within_tolerance(r) and r["name"] not in listed)
    fixed = {r["name"] for r in results if r["name"] in listed and within_tolerance(r)}
    for name in off:
        print(f"off and not a known gap (fix the rule): {name}")
    for name in sorted(fixed):
        print(f"within {100 * TOLERANCE:g}% now: {name}")
    if write and fixed:
        with open(GAPS, "w", encoding="utf-8") as f:
            f.writelines(ln for ln in lines if ln.split("#")[0].strip() not in fixed)
    return 1 if off else 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="fidelity.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="record and compare a grid")
    r.add_argument("--grid", choices=sorted(GRIDS), default="ci")
    r.add_argument("--only", default="", help="only points whose name contains this")
    r.add_argument("--out", help="write the results (JSON) here")
    r.add_argument("--keep", help="keep traces and configs in this folder")
    t = sub.add_parser("table", help="render results as docs/fidelity.md's table")
    t.add_argument("results")
    t.add_argument("--markdown", help="splice the table into this file between its markers")
    t.add_argument("--section", choices=sorted(SECTIONS), default="",
                   help="which table of the file: the default one, or 'ranks' (--grid ranks)")
    g = sub.add_parser("gaps", help="compare results with tools/reference/known_gaps.txt; "
                                    "--write drops the listed points that now pass")
    g.add_argument("results")
    g.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "gaps":
        with open(args.results, encoding="utf-8") as f:
            return shrink_gaps(json.load(f), args.write)
    if args.cmd == "table":
        with open(args.results, encoding="utf-8") as f:
            table = markdown_table(json.load(f))
        if args.markdown:
            text = splice(args.markdown, table, args.section)
            with open(args.markdown, "w", encoding="utf-8") as f:
                f.write(text)
        else:
            sys.stdout.write(table)
        return 0
    points = [p for p in GRIDS[args.grid]() if args.only in p.name()]
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        results = run_points(points, args.keep)
    else:
        with tempfile.TemporaryDirectory() as d:
            results = run_points(points, d)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1, sort_keys=True)
            f.write("\n")
    sys.stdout.write(markdown_table(results))
    return 0 if all(within_tolerance(r) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
