"""``%gpumonitor`` (inline monitor for classic notebook / VS Code), without a kernel."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pynvml
import pytest
from fake_nvml import FakeNvml, gpu
from sampler_doubles import NoGpu, StepHost

from torchlens.capture.monitor.gpu import NvmlSampler
from torchlens.frontends.monitor.gpumonitor import (
    InlineMonitor,
    gpumonitor_magic,
    monitor_options,
    summary_html,
)
from torchlens.model import InputError


def test_streams_one_row_per_step_with_nan_for_unsupported() -> None:
    devices = [gpu("GPU-a"), gpu("GPU-b", util=pynvml.NVMLError_NotSupported)]
    nvml = NvmlSampler(api=FakeNvml(devices), environ={}, process_name=lambda p: None)
    mon = InlineMonitor(StepHost(), nvml, interval=1.0, minutes=5)
    for _ in range(3):
        mon.step()
    data = mon.source.data
    assert len(data["t"]) == 4 and data["host CPU"] == [1.0, 2.0, 3.0, 4.0]
    assert data["GPU0 util"][-1] == 42 and math.isnan(data["GPU1 util"][-1])
    assert data["GPU0 mem"][-1] == 25.0


def test_summary_says_no_gpu_and_escapes() -> None:
    mon = InlineMonitor(StepHost(), NoGpu(), interval=1.0, minutes=1)
    text = summary_html(mon.step(), stopped=True)
    assert (
        "no NVIDIA GPU found (NVIDIA driver not loaded)" in text
        and "stopped at" in text
    )


def test_magic_runs_for_its_duration_and_stops() -> None:
    mon = gpumonitor_magic(interval=0.1, duration=0.5)
    mon.thread.join(10)
    assert not mon.thread.is_alive() and len(mon.source.data["t"]) >= 3


def test_arguments_are_clamped() -> None:
    assert monitor_options(interval=0)["interval"] == 0.1
    assert monitor_options(interval=1e6)["interval"] == 60.0
    assert monitor_options()["duration"] == 0.0


def test_bad_arguments_name_the_parameter() -> None:
    with pytest.raises(InputError, match="^duration must be >= 0"):
        monitor_options(duration=-1)
    with pytest.raises(InputError, match="^minutes must be > 0"):
        monitor_options(minutes=0)


def test_summary_says_what_was_not_read_and_how_old_pcie_is() -> None:
    now = [0.0]
    devices = [
        gpu("GPU-a", power_mw=pynvml.NVMLError_NotSupported,
            limit_mw=pynvml.NVMLError_NotSupported, nvlink_kib={}),
        gpu("GPU-b", name="NVIDIA GeForce RTX 4090"),
    ]
    nvml = NvmlSampler(api=FakeNvml(devices), environ={}, process_name=lambda p: None,
                       clock=lambda: now[0], nested_pids=True)
    mon = InlineMonitor(StepHost(), nvml, interval=1.0, minutes=5)  # PCIe read at 0 s
    now[0] = 3.2
    text = summary_html(mon.step())
    gpu0 = text.split("GPU 0 ")[1].split("GPU 1 ")[0]
    assert "PCIe tx 1 MB/s · rx 2 MB/s (read 3 s ago)" in gpu0
    # one line per GPU, metrics grouped by why NVML refused them
    assert "<br>&nbsp;&nbsp;not read: driver-reserved memory (NVML memory info v2 " in gpu0
    assert ("; power, power limit (NVMLError_NotSupported); "
            "NVLink tx (field 138: NVML_ERROR_NOT_SUPPORTED; field 202: "
            "NVML_ERROR_NOT_SUPPORTED); NVLink rx (field 139") in gpu0
    # two models under CUDA's default order: no cuda:k, and why
    assert "(cuda:" not in text and "no CUDA ordinal: CUDA_DEVICE_ORDER is FASTEST_FIRST" in gpu0
    assert "<br>process ids are the host's (this kernel runs in a container); names not shown" in text


def test_summary_names_the_cuda_ordinal_and_reserved_memory() -> None:
    v2 = SimpleNamespace(used=3 * 2**30, total=40 * 2**30, free=36 * 2**30, reserved=2**29)
    nvml = NvmlSampler(api=FakeNvml([gpu("GPU-a", mem_v2=v2)]), environ={},
                       process_name=lambda p: None, nested_pids=False)
    text = summary_html(InlineMonitor(StepHost(), nvml, interval=1.0, minutes=5).step())
    assert "GPU 0 (cuda:0) NVIDIA A100" in text
    assert "reserved by the driver" in text and "not read" not in text
    assert "host's" not in text


def test_untrusted_notebook_shows_a_sentence_not_the_widgets_repr(monkeypatch) -> None:
    """A reopened (untrusted) notebook showed 'VBox(children=(BokehModel(...' and the
    cell's Out[] '<...InlineMonitor at 0x...>'."""
    import IPython.display

    shown: list = []
    monkeypatch.setattr(IPython.display, "display",
                        lambda *a, **k: shown.append((a, k)) or None)
    mon = gpumonitor_magic(interval=0.1, duration=0.3)
    mon.thread.join(10)
    # the widget's own bundle (inside a shell, BokehJS's loader is displayed raw first)
    widget = next(a[0] for a, k in shown if k.get("raw") and "text/plain" in a[0])
    assert "application/vnd.jupyter.widget-view+json" in widget
    assert widget["text/plain"].startswith("GPU monitor: a live widget")
    assert "VBox" not in widget["text/plain"]
    assert repr(mon).startswith("GPU monitor: stopped") and "0x" not in repr(mon)
