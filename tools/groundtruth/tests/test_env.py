"""Environment capture, on a machine without a GPU (and with a fake nvidia-smi)."""

import pytest

from gtlib import env as envmod

FIELDS = ("python_version", "platform", "hostname_sha256", "packages", "env_vars",
          "torch_version", "cuda_version", "cudnn_version", "gpu_present", "gpu", "gpu_count",
          "driver_version", "driver_version_source", "nvidia_smi", "allocator_backend",
          "importable")


def no_smi(argv, timeout_s=15):
    return None


def test_without_torch_imports_nothing_and_marks_no_gpu():
    e = envmod.capture_environment(None, run=no_smi)
    for field in FIELDS:
        assert field in e
    assert e["gpu_present"] is False and e["gpu"] is None
    assert set(envmod.PACKAGES) <= set(e["packages"])
    assert len(e["hostname_sha256"]) == 16
    assert "PYTORCH_CUDA_ALLOC_CONF" in e["env_vars"]


def test_with_cpu_torch_marks_gpu_absent():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this test describes a machine without a GPU")
    e = envmod.capture_environment(torch, probe_gpu=True, run=no_smi)
    assert e["torch_version"] == str(torch.__version__)
    assert e["packages"]["torch"]  # from metadata, or torch.__version__ when metadata is absent
    assert e["gpu_present"] is False and e["gpu"] is None and e["gpu_count"] == 0
    assert e["driver_version"] is None


SMI_GPUS = "0, NVIDIA H100 80GB HBM3, 580.159.04, 81559, 1\n"
SMI_APPS = "4242, 1536\n4243, 100\n4242, 2\n"


def fake_smi(argv, timeout_s=15):
    if argv[1].startswith("--query-gpu"):
        return SMI_GPUS
    if argv[1].startswith("--query-compute-apps"):
        return SMI_APPS
    return None


def test_nvidia_smi_parsing():
    gpus = envmod.nvidia_smi_gpus(fake_smi)
    assert gpus == [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "driver_version": "580.159.04",
                     "memory_total_bytes": 81559 << 20, "memory_used_bytes": 1 << 20}]
    e = envmod.capture_environment(None, run=fake_smi)
    assert e["gpu_present"] is True and e["driver_version"] == "580.159.04"
    assert e["driver_version_source"] == "nvidia-smi"
    assert e["gpu"]["total_memory_bytes"] == 81559 << 20


def test_nvidia_smi_process_memory():
    assert envmod.nvidia_smi_process_used_bytes(4242, fake_smi) == (1536 + 2) << 20
    assert envmod.nvidia_smi_process_used_bytes(1, fake_smi) is None
    assert envmod.nvidia_smi_process_used_bytes(4242, no_smi) is None


def test_garbage_from_nvidia_smi_is_ignored():
    assert envmod.nvidia_smi_gpus(lambda a, timeout_s=15: "garbage\n,,\n") == []
    assert envmod.nvidia_smi_process_used_bytes(1, lambda a, timeout_s=15: "x, y\n") is None


def test_missing_command_returns_none():
    assert envmod._run(["definitely-not-a-command-vramscope"]) is None


def test_importable_modules_does_not_import():
    found = envmod.importable_modules(("json", "definitely_not_a_module_vramscope"))
    assert found == {"json": True, "definitely_not_a_module_vramscope": False}
