"""vramscope from Python, notebook style: estimate -> report -> plot.

Each `# %%` block is a notebook cell (VS Code, Jupytext and PyCharm run them as such); as
a script it writes its pages and charts to the folder given (default: the current one):

    pip install .            # once, from the repository
    python examples/notebook_estimate.py out/

tests/python_api_test.py runs it.
"""
# %% Estimate: the knobs are the CLI's flags, dashes as underscores.
import pathlib
import sys

import vramscope

out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
out.mkdir(parents=True, exist_ok=True)
report = vramscope.estimate("llama-3-8b", batch=2, seq=2048, finetune="lora", lora_rank=16,
                            grad_ckpt="full", gpu="a100-80g")
report  # in a notebook: a table of the three numbers, the chart and what was assumed

# %% The report: the three numbers, the breakdown at the peak, what it assumed.
GiB = 2**30
print(f"peak allocated {report.peak_allocated_bytes / GiB:.2f} GiB, "
      f"peak reserved {report.peak_reserved_bytes / GiB:.2f} GiB, "
      f"device total {report.device_total_bytes / GiB:.2f} GiB "
      f"({'fits' if report.fits else 'does not fit'} on {report.gpu['name']})")
for category, size in report.breakdown.items():
    if size:
        print(f"  {category:16s} {size / GiB:8.2f} GiB")
for a in report.assumptions:
    print(f"  assumed {a['what']}: {a['assumed']}")
for row in report.live_at_peak[:5]:
    print(f"  alive at the peak: {row['block_bytes'] / GiB:.2f} GiB {row['category']} "
          f"{row['op']} {row['module']}")

# %% Plot: the timeline as arrays (numpy when installed), or a DataFrame with pandas.
timeline = report.timeline
print(f"{len(timeline['allocated_bytes'])} timeline points, phases "
      f"{sorted(set(timeline['phase']))}")
try:
    import matplotlib
    matplotlib.use("Agg")
    ax = report.plot()
    ax.figure.savefig(out / "timeline.png")
except ImportError:
    print("matplotlib is not installed: the SVG chart only")
report.to_svg(out / "timeline.svg")
report.to_html(out / "llama-3-8b.html")

# %% What if: a sweep over the sequence length, and the largest batch that fits.
sweep = vramscope.sweep("llama-3-8b", seq="512:4096:4", finetune="lora", gpu="a100-80g")
for point in sweep.points:
    print(f"  seq {point['seq']}: peak allocated "
          f"{point['peak_allocated_bytes'] / GiB:.2f} GiB")
fit = vramscope.fit("llama-3-8b", finetune="lora", gpu="a100-80g", seq=2048)
print(f"largest micro-batch at seq 2048: {fit.max_batch}; longest sequence at batch 1: "
      f"{fit.max_seq}")
