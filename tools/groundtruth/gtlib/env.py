"""Environment capture: GPU, driver, CUDA, library versions, Python, host.

`capture_environment(torch)` never initialises CUDA unless `probe_gpu` is
true; the driver process calls it with torch=None so that it holds no CUDA
context (which would show up in the workers' device-memory readings).
Library versions come from package metadata, so nothing is imported.
`run` is a seam: tests pass a fake that returns canned nvidia-smi output.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import sys

# Distribution names whose versions are recorded (None when not installed).
PACKAGES = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "flash-attn",
            "liger-kernel", "safetensors", "numpy", "triton", "deepspeed")
# Import names the plans may require; whether each can be found is recorded.
MODULES = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "flash_attn",
           "liger_kernel", "deepspeed")
# Environment variables that change allocator or device behaviour.
ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
            "CUDA_VISIBLE_DEVICES", "CUDA_MODULE_LOADING", "CUBLAS_WORKSPACE_CONFIG",
            "NCCL_P2P_DISABLE")
MIB = 1 << 20


def _run(argv, timeout_s=15):
    """Runs a command; returns its stdout, or None if it is missing or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def package_versions(names=PACKAGES):
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def importable_modules(names=MODULES):
    """{name: bool}: whether each top-level module can be found (nothing is imported)."""
    found = {}
    for name in names:
        try:
            found[name] = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found[name] = False
    return found


def nvidia_smi_gpus(run=_run):
    """GPUs as nvidia-smi reports them, or None when nvidia-smi is absent or fails."""
    out = run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,memory.used",
               "--format=csv,noheader,nounits"])
    if out is None:
        return None
    gpus = []
    for line in out.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            continue
        index, name, driver, total_mib, used_mib = fields
        gpus.append({
            "index": _int_or_none(index),
            "name": name,
            "driver_version": driver,
            "memory_total_bytes": _mib_bytes(total_mib),
            "memory_used_bytes": _mib_bytes(used_mib),
        })
    return gpus


def nvidia_smi_process_used_bytes(pid, run=_run):
    """Device memory nvidia-smi attributes to process `pid`, or None if not listed.

    Inside containers nvidia-smi often shows host pids or none at all: None then.
    """
    out = run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    if out is None:
        return None
    total = None
    for line in out.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and _int_or_none(fields[0]) == pid:
            used = _mib_bytes(fields[1])
            if used is not None:
                total = (total or 0) + used
    return total


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _mib_bytes(text):
    value = _int_or_none(text)
    return None if value is None else value * MIB


def capture_environment(torch=None, probe_gpu=False, run=_run):
    """Returns the environment dict recorded with every result (see docs/groundtruth.md).

    torch: the imported torch module, or None (versions then come from metadata).
    probe_gpu: query torch.cuda (initialises CUDA); only the worker does this.
    """
    env = {
        "python_version": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "hostname_sha256": hashlib.sha256(socket.gethostname().encode()).hexdigest()[:16],
        "packages": package_versions(),
        "importable": importable_modules(),
        "env_vars": {k: os.environ.get(k) for k in ENV_VARS},
        "torch_version": None,
        "cuda_version": None,
        "cudnn_version": None,
        "gpu_present": False,
        "gpu": None,
        "gpu_count": 0,
        "driver_version": None,
        "driver_version_source": None,
        "nvidia_smi": None,
        "allocator_backend": None,
    }
    if torch is not None:
        env["torch_version"] = str(torch.__version__)
        env["packages"]["torch"] = env["packages"]["torch"] or str(torch.__version__)
        env["cuda_version"] = getattr(torch.version, "cuda", None)
        try:
            env["cudnn_version"] = torch.backends.cudnn.version()
        except Exception:  # cudnn missing on CPU builds
            env["cudnn_version"] = None

    smi = nvidia_smi_gpus(run)
    env["nvidia_smi"] = smi
    if smi:
        env["driver_version"] = smi[0]["driver_version"]
        env["driver_version_source"] = "nvidia-smi"

    if torch is not None and probe_gpu and torch.cuda.is_available():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        env["gpu_present"] = True
        env["gpu_count"] = torch.cuda.device_count()
        env["gpu"] = {
            "index": index,
            "name": props.name,
            "total_memory_bytes": int(props.total_memory),
            "compute_capability": f"{props.major}.{props.minor}",
            "multi_processor_count": int(props.multi_processor_count),
        }
        if env["driver_version"] is None:
            # No nvidia-smi: the CUDA driver API version is the best we have.
            try:
                env["driver_version"] = str(torch._C._cuda_getDriverVersion())
                env["driver_version_source"] = "cuda-driver-api"
            except Exception:
                env["driver_version_source"] = "unavailable"
        try:
            env["allocator_backend"] = torch.cuda.get_allocator_backend()
        except Exception:
            env["allocator_backend"] = None
    elif smi:
        env["gpu_present"] = True
        env["gpu_count"] = len(smi)
        env["gpu"] = {"index": smi[0]["index"], "name": smi[0]["name"],
                      "total_memory_bytes": smi[0]["memory_total_bytes"],
                      "compute_capability": None, "multi_processor_count": None}
    return env
