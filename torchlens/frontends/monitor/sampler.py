"""The one sampler thread of a Jupyter server, and its history.

Why one thread for the whole server: N browser tabs must not mean N NVML
pollers. Every tab reads the same ring buffer, so reloading a page (or opening
a second one) shows the same last ten minutes. The thread sleeps on an Event,
so the server's event loop never waits on NVML; it hands each new sample to
the loop with ``IOLoop.add_callback`` (thread-safe), where long-poll waiters
are woken and listeners (the WebSocket broadcaster) push it to clients.

Sampling slows to ``idle_interval`` when no socket is open and no client has
polled for ``idle_after`` seconds: a server nobody watches costs almost nothing.
"""

from __future__ import annotations

import asyncio
import csv
import io
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any, Generic, TypeVar

from torchlens.capture.monitor.gpu import Sampler
from torchlens.frontends.shared.rank_channel import MEMORY_SOURCES
from torchlens.model.samples import GpuSample, HostSample, MachineSample, RankSample

MIN_INTERVAL = 0.1
MAX_INTERVAL = 60.0


ItemT = TypeVar("ItemT", MachineSample, RankSample)


class History(Generic[ItemT]):
    """Time-bounded ring buffer of samples (each taken at its ``t``), oldest first."""

    def __init__(self, seconds: float = 600.0, max_items: int = 6000) -> None:
        self.seconds = seconds
        self._items: deque[ItemT] = deque(maxlen=max_items)
        self._lock = threading.Lock()
        self._seq = 0  # items ever appended: a cursor that, unlike ``t``, never repeats

    def append(self, item: ItemT) -> None:
        """Add one sample and drop those older than ``seconds`` before it."""
        with self._lock:
            self._items.append(item)
            self._seq += 1
            horizon = item.t - self.seconds
            while self._items and self._items[0].t < horizon:
                self._items.popleft()

    def since(self, t: float) -> list[ItemT]:
        """Samples strictly newer than ``t`` (all of them for ``t <= 0``)."""
        with self._lock:
            if not self._items or self._items[-1].t <= t:
                return []
            return [s for s in self._items if s.t > t]

    def tail(
        self, after: int, upto: int | None = None
    ) -> tuple[list[ItemT], int]:
        """Items appended after sequence number ``after`` (up to ``upto``), and the newest number.

        Why sequence numbers: the WebSocket broadcaster must send every item
        exactly once, and timestamps cannot promise that (rank samples carry
        the kernels' clocks; the wall clock can step back).
        """
        with self._lock:
            seq = self._seq
            end = seq if upto is None else min(upto, seq)
            stop = max(
                0, len(self._items) - (seq - end)
            )  # index just past item ``end``
            count = min(stop, max(0, end - after))  # evicted items are simply gone
            if count > 64:  # history on connect: one pass over the deque
                return list(islice(self._items, stop - count, stop)), seq
            # a broadcast tick: the newest item(s), O(1) from the deque's right end
            return [self._items[i] for i in range(stop - count, stop)], seq

    @property
    def seq(self) -> int:
        with self._lock:
            return self._seq

    def last_time(self) -> float:
        with self._lock:
            return self._items[-1].t if self._items else 0.0

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class Monitor:
    """Owns the samplers, the sampling thread, the sample history and rank samples."""

    def __init__(
        self,
        host: Sampler[HostSample],
        gpu: Sampler[GpuSample],
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
        self.history: History[MachineSample] = History(history_seconds, max_items)
        self.ranks: History[RankSample] = History(history_seconds, max_items)
        self.samples_taken = 0
        self.watchers = 0  # open, unpaused WebSockets: full rate while > 0
        self._last_request = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: Any = None  # tornado IOLoop (or asyncio loop in tests)
        self._new = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []

    # -- lifecycle -------------------------------------------------------
    def start(self, loop: Any = None) -> None:
        """Start the sampling thread; ``loop`` (the server's IOLoop) is where handlers live."""
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

    def watch(self, delta: int) -> None:
        """A socket started (+1) or stopped (-1) watching; on the loop thread only."""
        was_idle = self.idle
        self.watchers = max(0, self.watchers + delta)
        # counts as a request: after the last socket closes, idle_after runs from now
        self._last_request = time.monotonic()
        if was_idle:
            self._wake.set()  # a new watcher must not wait out an idle-rate sleep

    @property
    def idle(self) -> bool:
        if self.watchers > 0:
            return False
        return time.monotonic() - self._last_request > self.idle_after

    def current_interval(self) -> float:
        return max(self.interval, self.idle_interval) if self.idle else self.interval

    def set_interval(self, seconds: float) -> float:
        """Change the active sampling interval (clamped); takes effect at once."""
        self.interval = min(MAX_INTERVAL, max(MIN_INTERVAL, float(seconds)))
        self._wake.set()
        return self.interval

    # -- sampling --------------------------------------------------------
    def sample_once(self) -> MachineSample:
        """Take one combined host+GPU sample and store it."""
        gpu = self.gpu.sample()
        sample = MachineSample(t=time.time(), host=self.host.sample(), gpu=gpu)
        self.history.append(sample)
        self.samples_taken += 1
        self._handoff()
        return sample

    def _handoff(self) -> None:
        """From any thread: run ``_notify`` on the server's loop, never blocking either side."""
        loop = self._loop
        if loop is None:
            return
        if hasattr(
            loop, "add_callback"
        ):  # tornado IOLoop: thread-safe, logs callback errors
            try:
                loop.add_callback(self._notify)
            except RuntimeError:  # loop closed during shutdown
                pass
        elif not loop.is_closed():
            loop.call_soon_threadsafe(self._notify)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` on the loop after each new sample or rank batch."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        if callback in self._listeners:
            self._listeners.remove(callback)

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
        for callback in list(self._listeners):
            callback()

    async def wait_for_newer(self, since: float, timeout: float) -> None:
        """Return when a sample newer than ``since`` exists, or after ``timeout`` s."""
        if self.history.last_time() > since or timeout <= 0:
            return
        try:
            await asyncio.wait_for(self._new.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    # -- per-rank memory from kernels -----------------------------------
    def add_rank_samples(self, run: str, samples: Iterable[Any]) -> int:
        """Store per-rank memory samples published by a kernel's magic.

        Every sample is checked (``rank_sample``) before any is stored, so a
        bad one refuses the whole batch (ValueError/TypeError/KeyError) and
        leaves the history as it was.
        """
        checked = [rank_sample(run, s) for s in samples]
        for sample in checked:
            self.ranks.append(sample)
        self._handoff()
        return len(checked)

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


def flatten(sample: MachineSample) -> dict[str, str | float | None]:
    """One sample -> flat CSV row (``host_cpu_percent``, ``gpu0_util_gpu``, ...)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(sample.t))
    row: dict[str, str | float | None] = {"time": f"{stamp}.{int(sample.t % 1 * 1000):03d}"}
    for key in sample.host.__struct_fields__:
        if key != "t":
            row[f"host_{key}"] = getattr(sample.host, key)
    for gpu in sample.gpu.gpus:
        prefix = f"gpu{gpu.index}" + (
            f"_mig{gpu.mig_slot}" if gpu.mig_parent is not None else ""
        )
        for key in (
            "util_gpu",
            "util_mem",
            "mem_used",
            "mem_total",
            "mem_reserved",
            "temp_c",
            "power_w",
            "pcie_tx_bps",
            "pcie_rx_bps",
            "nvlink_tx_bps",
            "nvlink_rx_bps",
        ):
            row[f"{prefix}_{key}"] = getattr(gpu, key)
    return row


#: Byte counts a rank sample may carry, each a number or null.
RANK_BYTES = ("allocated", "reserved", "inactive_split", "largest_free")


def rank_sample(run: str, s: Any) -> RankSample:
    """One posted rank sample, checked and reduced to the fields the sidebar reads.

    ``rank`` is a non-negative integer, ``device`` an integer or null, ``t`` a
    finite number (absent: now), the byte counts (``RANK_BYTES``) non-negative
    finite numbers or null, ``source`` null or one of ``MEMORY_SOURCES``,
    ``final`` true or false: true on the report figures a finished
    ``%%gpumem`` cell posts (``live_publish.report_samples``), which then
    carry ``peak`` (the report's peak allocated bytes, or null). Anything
    else raises (the handler answers 400): nothing posted is passed on
    unchecked, so no string a kernel sends can reach the page as markup.
    """
    if not isinstance(s, dict):
        raise TypeError("a sample must be an object")
    rank = s["rank"]
    if not _is_int(rank) or rank < 0:
        raise ValueError("rank must be a non-negative integer")
    t = s.get("t")
    if t is None:
        t = time.time()
    elif not _is_number(t):
        raise ValueError("t must be a finite number")
    device = s.get("device")
    if device is not None and not _is_int(device):
        raise ValueError("device must be an integer or null")
    source = s.get("source")
    if source is not None and source not in MEMORY_SOURCES:
        raise ValueError(f"source must be null or one of {', '.join(MEMORY_SOURCES)}")
    final = s.get("final", False)
    if not isinstance(final, bool):
        raise ValueError("final must be true or false")
    out = RankSample(t=float(t), run=run, rank=rank, device=device,
                     **{key: _opt_bytes(key, s.get(key)) for key in RANK_BYTES},
                     source=source)
    peak = _opt_bytes("peak", s.get("peak"))
    if final:  # only then: a live sample stays the shape it always had
        out.final, out.peak = True, peak
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    # json.loads accepts NaN and Infinity, which json.dumps would send on as
    # tokens the browser's JSON.parse rejects
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _opt_bytes(key: str, value: Any) -> int | None:
    if value is None:
        return None
    if not _is_number(value) or value < 0:
        raise ValueError(f"{key} must be a non-negative number or null")
    return int(value)
