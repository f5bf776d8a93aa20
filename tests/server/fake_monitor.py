"""The extension's monitor over fake NVML GPUs from its first sample on.

Why not swap ``monitor.gpu`` in a test: the sampler thread is already running,
and a sample it started with the real NVML (none on CPU) can land after the
test's own, so a scrape sees no GPU. Patching ``make_monitor`` before the
server starts means every sample, and every scrape, sees the fake.
"""

from __future__ import annotations

from typing import Any

import pytest
from fake_nvml import FakeNvml

import torchlens.frontends.server as server_extension
from torchlens.capture.monitor.gpu import NvmlSampler
from torchlens.capture.monitor.host import HostSampler
from torchlens.frontends.monitor.sampler import Monitor


def install_fake_gpus(monkeypatch: pytest.MonkeyPatch, devices: list[dict[str, Any]],
                      interval: float = 0.2) -> None:
    """The next server's monitor samples ``devices`` (``fake_nvml.gpu`` dicts)."""

    def fake_monitor(settings: dict[str, Any]) -> Monitor:
        sampler = NvmlSampler(api=FakeNvml(devices), environ={}, process_name=lambda p: None)
        return Monitor(HostSampler(), sampler, interval=interval)

    monkeypatch.setattr(server_extension, "make_monitor", fake_monitor)
