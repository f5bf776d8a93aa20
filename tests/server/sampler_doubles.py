"""Sampler doubles for monitor tests: deterministic host values, a machine without a GPU."""

from __future__ import annotations

import time

from torchlens.model.samples import GpuSample, HostSample


class StepHost:
    """Host sampler double: deterministic CPU values 0, 1, 2, ..."""

    def __init__(self) -> None:
        self.n = 0

    def sample(self) -> HostSample:
        self.n += 1
        return HostSample(t=time.time(), cpu_percent=float(self.n), cpu_count=2, ram_used=1,
                          ram_total=2, ram_percent=50.0)

    def close(self) -> None:
        pass


class NoGpu:
    """GPU sampler double for a machine without a driver."""

    closed = False

    def sample(self) -> GpuSample:
        status = "no NVIDIA GPU found (NVIDIA driver not loaded)"
        return GpuSample(t=time.time(), available=False, status=status, gpus=[])

    def close(self) -> None:
        self.closed = True
