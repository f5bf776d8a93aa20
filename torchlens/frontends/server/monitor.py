"""The one sampler thread of a Jupyter server, and its history.

Why one thread for the whole server: N browser tabs must not mean N NVML
pollers. Every tab reads the same ring buffer, so reloading a page (or opening
a second one) shows the same last ten minutes. The thread sleeps on an Event,
so the server's event loop never waits on NVML; new samples wake waiting
handlers through ``loop.call_soon_threadsafe``.

Sampling slows to ``idle_interval`` when no client has asked for data for
``idle_after`` seconds: a server nobody watches costs almost nothing.
"""

from __future__ import annotations

import asyncio
import csv
import io
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from ...capture.gpu_sampler import Sampler

MIN_INTERVAL = 0.1
MAX_INTERVAL = 60.0


class History:
    """Time-bounded ring buffer of samples (dicts with a ``t`` key), oldest first."""

    def __init__(self, seconds: float = 600.0, max_items: int = 6000) -> None:
        self.seconds = seconds
        self._items: deque[dict[str, Any]] = deque(maxlen=max_items)
        self._lock = threading.Lock()

    def append(self, item: dict[str, Any]) -> None:
        """Add one sample and drop those older than ``seconds`` before it."""
        with self._lock:
            self._items.append(item)
            horizon = item["t"] - self.seconds
            while self._items and self._items[0]["t"] < horizon:
                self._items.popleft()

    def since(self, t: float) -> list[dict[str, Any]]:
        """Samples strictly newer than ``t`` (all of them for ``t <= 0``)."""
        with self._lock:
            if not self._items or self._items[-1]["t"] <= t:
                return []
            return [s for s in self._items if s["t"] > t]

    def last_time(self) -> float:
        with self._lock:
            return self._items[-1]["t"] if self._items else 0.0

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class Monitor:
    """Owns the samplers, the sampling thread, the sample history and rank samples."""

    def __init__(
        self,
        host: Sampler,
        gpu: Sampler,
        interval: float = 1.0,
        idle_interval: float = 10.0,
        idle_after: float = 30.0,
        history_seconds: float = 600.0,
    ) -> None:
        self.host, self.gpu = host, gpu
        self.interval = interval
        self.idle_interval = idle_interval
        self.idle_after = idle_after
        max_items = int(history_seconds / MIN_INTERVAL) + 1
        self.history = History(history_seconds, max_items)
        self.ranks = History(history_seconds, max_items)
        self.samples_taken = 0
        self._last_request = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._new = asyncio.Event()

    # -- lifecycle -------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the sampling thread; ``loop`` is where waiting handlers live."""
        self._loop = loop
        self._thread = threading.Thread(
            target=self._run, name="torchlens-monitor", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and release NVML."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.host.close()
        self.gpu.close()

    # -- rate ------------------------------------------------------------
    def touch(self) -> None:
        """A client asked for data: sample at full rate (wake up if idling)."""
        was_idle = self.idle
        self._last_request = time.monotonic()
        if was_idle:
            self._wake.set()

    @property
    def idle(self) -> bool:
        return time.monotonic() - self._last_request > self.idle_after

    def current_interval(self) -> float:
        return max(self.interval, self.idle_interval) if self.idle else self.interval

    def set_interval(self, seconds: float) -> float:
        """Change the active sampling interval (clamped); takes effect at once."""
        self.interval = min(MAX_INTERVAL, max(MIN_INTERVAL, float(seconds)))
        self._wake.set()
        return self.interval

    # -- sampling --------------------------------------------------------
    def sample_once(self) -> dict[str, Any]:
        """Take one combined host+GPU sample and store it."""
        gpu = self.gpu.sample()
        sample = {"t": time.time(), "host": self.host.sample(), "gpu": gpu}
        self.history.append(sample)
        self.samples_taken += 1
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._notify)
        return sample

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
            except Exception:  # noqa: BLE001 - a sampler bug must not kill the monitor
                pass
            delay = self.current_interval() - (time.monotonic() - started)
            if self._wake.wait(max(0.0, delay)):
                self._wake.clear()

    def _notify(self) -> None:
        """On the event loop: wake every waiter, arm a fresh event for the next ones."""
        self._new.set()
        self._new = asyncio.Event()

    async def wait_for_newer(self, since: float, timeout: float) -> None:
        """Return when a sample newer than ``since`` exists, or after ``timeout`` s."""
        if self.history.last_time() > since or timeout <= 0:
            return
        try:
            await asyncio.wait_for(self._new.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    # -- per-rank memory from kernels -----------------------------------
    def add_rank_samples(self, run: str, samples: Iterable[dict[str, Any]]) -> int:
        """Store per-rank memory samples published by a kernel's magic."""
        count = 0
        for s in samples:
            self.ranks.append(
                {
                    "t": float(s.get("t", time.time())),
                    "run": run,
                    "rank": int(s["rank"]),
                    "device": s.get("device"),
                    "allocated": _opt_int(s.get("allocated")),
                    "reserved": _opt_int(s.get("reserved")),
                }
            )
            count += 1
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._notify)
        return count

    # -- export ----------------------------------------------------------
    def to_csv(self) -> str:
        """The whole history as one wide CSV: one row per sample, n/a cells empty."""
        rows = [flatten(s) for s in self.history.since(0.0)]
        columns: dict[str, None] = {"time": None}
        for row in rows:
            columns.update(dict.fromkeys(row))
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()


def flatten(sample: dict[str, Any]) -> dict[str, Any]:
    """One sample -> flat CSV row (``host_cpu_percent``, ``gpu0_util_gpu``, ...)."""
    row: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(sample["t"]))
    }
    row["time"] += f".{int(sample['t'] % 1 * 1000):03d}"
    for key, value in sample["host"].items():
        if key != "t":
            row[f"host_{key}"] = value
    for gpu in sample["gpu"].get("gpus", []):
        prefix = f"gpu{gpu['index']}" + (
            f"_mig{gpu['mig_slot']}" if gpu.get("mig_parent") is not None else ""
        )
        for key in (
            "util_gpu",
            "util_mem",
            "mem_used",
            "mem_total",
            "temp_c",
            "power_w",
            "pcie_tx_bps",
            "pcie_rx_bps",
        ):
            row[f"{prefix}_{key}"] = gpu.get(key)
    return row


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)
