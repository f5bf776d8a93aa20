"""``%gpumonitor`` (inline monitor for classic notebook / VS Code), without a kernel."""

from __future__ import annotations

import math

import pynvml
import pytest
from fake_nvml import FakeNvml, gpu
from sampler_doubles import NoGpu, StepHost

from torchlens.capture.monitor.gpu import NvmlSampler
from torchlens.frontends.gpumonitor import (
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
