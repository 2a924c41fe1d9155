"""Runs a reference module's run() in a child interpreter with a library folder on its path.

torchtune's and LitGPT's libraries live in their own folders under .venv (installed
--no-deps by scripts/python_env.sh), beside .venv/tf5's torch: they are seen by the child
process only, because their pins clash with what the other points import (PEFT refuses
torchtune's torchao; LitGPT's full dependencies would replace tf5's huggingface_hub).
"""

import json
import os
import subprocess
import sys
import tempfile


def run_in_child(module, extra, point, config, out_path):
    """`python -m vsref.MODULE JOB` with `extra` first on PYTHONPATH; JOB holds the point,
    the config and the trace's path. Raises RuntimeError with the child's last error line."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"point": point.to_json(), "config": config, "out": out_path}, f)
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([extra, here, env.get("PYTHONPATH", "")])
    try:
        proc = subprocess.run([sys.executable, "-m", f"vsref.{module}", f.name],
                              capture_output=True, text=True, env=env)
    finally:
        os.unlink(f.name)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed")
