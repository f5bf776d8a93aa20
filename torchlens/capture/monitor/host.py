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

from torchlens.model.samples import HostSample

#: psutil's CPU percent over less than a few clock ticks reads 0.0: the first
#: sample waits until the baseline is this old.
MIN_CPU_WINDOW_S = 0.1


def busy_percent(before: Any, after: Any) -> float | None:
    """All cores' busy share (0-100) between two ``psutil.cpu_times()``, as psutil's
    ``cpu_percent`` computes it (idle and iowait are not busy; guest time is already
    in user time on Linux); None when no clock tick passed."""
    delta = {k: max(0.0, getattr(after, k) - getattr(before, k)) for k in after._fields}
    total = sum(delta.values()) - delta.get("guest", 0.0) - delta.get("guest_nice", 0.0)
    if total <= 0:
        return None
    busy = total - delta["idle"] - delta.get("iowait", 0.0)
    return round(min(max(0.0, 100.0 * busy / total), 100.0), 1)


class HostSampler:
    """CPU percent (all cores, since the previous call), RAM and load average."""

    def __init__(self) -> None:
        # CPU busy share between two psutil.cpu_times() kept here, not psutil's
        # cpu_percent: that keeps its baseline per thread (psutil >= 5.9.6), and the
        # Jupyter server makes this sampler on its loop but samples in the monitor's
        # thread, whose first reading was 0.0 on a busy machine. Measured once here
        # over MIN_CPU_WINDOW_S (the only wait: a sample must never block its caller);
        # a sample sooner than that after the last repeats the last measured figure.
        start = psutil.cpu_times()
        time.sleep(MIN_CPU_WINDOW_S)
        self._times = psutil.cpu_times()
        self._since = time.monotonic()
        self._last_cpu: float | None = busy_percent(start, self._times)
        self.cpu_count = psutil.cpu_count() or 1

    def sample(self) -> HostSample:
        """One reading now; percentages are 0-100 (CPU None until one was measured)."""
        if time.monotonic() - self._since >= MIN_CPU_WINDOW_S:
            now = psutil.cpu_times()
            measured = busy_percent(self._times, now)
            if measured is not None:
                self._last_cpu, self._times, self._since = measured, now, time.monotonic()
        cpu = self._last_cpu
        mem = psutil.virtual_memory()
        try:
            load1: float | None = os.getloadavg()[0]
        except (AttributeError, OSError):  # Windows
            load1 = None
        return HostSample(t=time.time(), cpu_percent=cpu, cpu_count=self.cpu_count,
                          ram_used=mem.total - mem.available, ram_total=mem.total,
                          ram_percent=mem.percent, load1=load1)

    def close(self) -> None:
        """Nothing to release; present to satisfy the sampler interface."""
