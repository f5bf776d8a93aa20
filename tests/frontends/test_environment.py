"""The environment a capture records (``capture.environment``).

torch.cuda and NVML are faked at exactly their boundary: a fake ``pynvml``
module in ``sys.modules`` (pynvml's own error classes, its function names)
and torch.cuda's device queries, as a GPU machine answers them.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pynvml
import pytest
import torch

from torchlens.capture import environment
from torchlens.capture.monitor import nvml


def _fake_pynvml(init_error: type | None = None) -> types.ModuleType:
    mod = types.ModuleType("pynvml")
    mod.NVMLError = pynvml.NVMLError
    mod.calls = []

    def init() -> None:
        mod.calls.append("nvmlInit")
        if init_error is not None:
            raise init_error()

    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: mod.calls.append("nvmlShutdown")
    mod.nvmlSystemGetDriverVersion = lambda: b"550.54.15"  # older bindings: bytes
    return mod


@pytest.fixture
def gpu_box(monkeypatch):
    """One CUDA device as torch reports it; NVML started afresh for the test."""
    monkeypatch.setattr(nvml, "_STARTED", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name="NVIDIA A100-SXM4-40GB",
                                                  total_memory=40 * 2**30))
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    return monkeypatch


def test_nvml_starts_once_per_process_not_per_capture(gpu_box):
    fake = _fake_pynvml()
    gpu_box.setitem(sys.modules, "pynvml", fake)
    for _ in range(3):
        env = environment.collect_environment()
        assert env["driver"] == "550.54.15" and env["nccl"] == "2.21.5"
    assert fake.calls == ["nvmlInit"]  # and never shut down between captures
    assert not any("driver" in u for u in env["unmeasured"])


def test_a_driver_nvml_cannot_reach_is_named_unmeasured_once_tried(gpu_box):
    fake = _fake_pynvml(init_error=pynvml.NVMLError_DriverNotLoaded)
    gpu_box.setitem(sys.modules, "pynvml", fake)
    for _ in range(2):
        env = environment.collect_environment()
        assert env["driver"] is None
        assert "GPU driver version: NVML unavailable (NVMLError_DriverNotLoaded)" in env[
            "unmeasured"]
    assert fake.calls == ["nvmlInit"]


def test_a_rocm_build_keeps_its_gpus_and_says_nvml_is_not_there(gpu_box):
    fake = _fake_pynvml()
    gpu_box.setitem(sys.modules, "pynvml", fake)
    gpu_box.setattr(torch.version, "hip", "6.2.41133", raising=False)
    gpu_box.setattr(torch.version, "cuda", None)
    env = environment.collect_environment()
    assert env["rocm"] == "6.2.41133" and env["cuda_available"] is True
    assert env["gpus"] == [{"index": 0, "name": "NVIDIA A100-SXM4-40GB",
                            "total_memory": 40 * 2**30}]
    assert "GPU driver version: ROCm build, NVML not available" in env["unmeasured"]
    assert not any("no NVIDIA" in u or "no CUDA" in u for u in env["unmeasured"])
    assert fake.calls == []  # NVML is not tried on an AMD box


def test_a_rocm_build_without_a_visible_gpu_says_rocm(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    monkeypatch.setattr(torch.version, "cuda", None)
    (line,) = environment.collect_environment()["unmeasured"]
    assert line.startswith("GPU: no ROCm device visible to torch (")
    assert "HIP 6.2.41133; NVML not available" in line
