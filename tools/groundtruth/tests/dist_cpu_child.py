"""Child process of test_worker_cpu.py's data-parallel test: runs the configurations given
as a JSON list (argv[1]) one after another through cpu_run.run_on_cpu, and prints one JSON
line per configuration: {"raw", "record", "plan"} or {"raw", "error"}.

A process of its own: deepspeed.zero.Init replaces torch's tensor factories process-wide
(deepspeed/runtime/zero/partition_parameters.py), which would change every test after it.
"""

import json
import os
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]
os.environ.setdefault("DS_ACCELERATOR", "cpu")


def main():
    import torch
    torch.set_num_threads(1)
    from cpu_run import run_on_cpu
    for raw in json.loads(sys.argv[1]):
        try:
            record, p = run_on_cpu(torch, **raw)
            line = {"raw": raw, "record": record, "plan": p}
        except Exception:  # noqa: BLE001  reported to the test, which fails with it
            line = {"raw": raw, "error": traceback.format_exc()[-3000:]}
        print("RESULT " + json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
