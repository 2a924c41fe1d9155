"""Timings of the Python package (README "Speed"): `import vramscope` (the package, and the
engine module loaded on first use), and one Llama-3-8B estimate from Python, next to the CLI
as a process. A benchmark, not a test: medians of repeated runs, printed.

    PYTHONPATH=build/python python3 bench/python_bench.py      # after scripts/build.sh
"""
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLI = os.environ.get("VRAMSCOPE_BIN", str(ROOT / "build" / "cli" / "vramscope"))
KNOBS = {"seq": 2048, "grad_ckpt": "full"}  # bench_pipeline's Llama-3-8B case


def median_ms(samples):
    return f"{statistics.median(samples) * 1000:.1f} ms (min {min(samples) * 1000:.1f})"


def process_seconds(args, runs=15):
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return samples


def main():
    py = sys.executable
    baseline = process_seconds([py, "-c", "pass"])
    package = process_seconds([py, "-c", "import vramscope"])
    engine = process_seconds([py, "-c", "import vramscope._core"])
    print(f"python -c pass:                     {median_ms(baseline)}")
    print(f"python -c 'import vramscope':       {median_ms(package)}")
    print(f"python -c 'import vramscope._core': {median_ms(engine)}")

    import vramscope
    from vramscope import _core
    for label in ("estimate llama-3-8b from Python", "the same after tune_malloc()"):
        if label.startswith("the same"):
            _core.tune_malloc()
        vramscope.estimate("llama-3-8b", **KNOBS)  # warm
        samples = []
        for _ in range(50):
            start = time.perf_counter()
            vramscope.estimate("llama-3-8b", **KNOBS)
            samples.append(time.perf_counter() - start)
        print(f"{label}: {median_ms(samples)}")
    cli = process_seconds([CLI, "estimate", "llama-3-8b", "--seq", "2048", "--grad-ckpt", "full",
                           "--json"])
    console = process_seconds([py, "-c", "import sys; from vramscope._cli import main; "
                               "sys.argv = ['vramscope', 'estimate', 'llama-3-8b', '--seq', "
                               "'2048', '--grad-ckpt', 'full', '--json']; sys.exit(main())"])
    print(f"CLI executable as a process:        {median_ms(cli)}")
    print(f"console script as a process:        {median_ms(console)}")
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
