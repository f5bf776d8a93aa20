"""Host sampler: CPU and RAM of the machine the Jupyter server runs on.

Why: the GPU monitor must stay useful on a laptop or CI box with no GPU, and a
data-loader-bound step shows up as busy CPUs and idle GPUs, so the host numbers
sit next to the GPU ones. Same interface as ``gpu_sampler.Sampler``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil

#: psutil's CPU percent over less than a few clock ticks reads 0.0: the first
#: sample waits until the baseline is this old.
MIN_CPU_WINDOW_S = 0.1


class HostSampler:
    """CPU percent (all cores, since the previous call), RAM and load average."""

    def __init__(self) -> None:
        # psutil measures CPU between two calls (a first call or a window of a
        # few microseconds reads 0.0). Measured here once, over MIN_CPU_WINDOW_S (the only wait: a sample
        # must never block its caller, the server's sampler thread or loop):
        # a sample that comes sooner than that after the last gives this
        # last measured figure rather than psutil's 0.0 for a tiny window.
        self._last_cpu: float = psutil.cpu_percent(interval=MIN_CPU_WINDOW_S)
        self._since = time.monotonic()
        self.cpu_count = psutil.cpu_count() or 1

    def sample(self) -> dict[str, Any]:
        """One reading now; percentages are 0-100."""
        if time.monotonic() - self._since >= MIN_CPU_WINDOW_S:
            self._last_cpu = psutil.cpu_percent(interval=None)
            self._since = time.monotonic()
        cpu = self._last_cpu
        mem = psutil.virtual_memory()
        try:
            load1: float | None = os.getloadavg()[0]
        except (AttributeError, OSError):  # Windows
            load1 = None
        return {
            "t": time.time(),
            "cpu_percent": cpu,
            "cpu_count": self.cpu_count,
            "ram_used": mem.total - mem.available,
            "ram_total": mem.total,
            "ram_percent": mem.percent,
            "load1": load1,
        }

    def close(self) -> None:
        """Nothing to release; present to satisfy the sampler interface."""
