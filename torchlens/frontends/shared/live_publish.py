"""Publishing a running magic's memory to the GPU Monitor sidebar.

While ``%%gpumem`` (one process) or ``%ddp_check`` (spawned ranks) runs, a
background thread calls a sample function every ``interval`` seconds and posts
what it returns through the rank channel in ``rank_channel`` (the
kernel's own Jupyter server, its own token). Outside a Jupyter server (a
script, VS Code) nothing is started. Publishing is best effort: a slow or
absent sidebar must never slow or break the user's cell.

When a ``%%gpumem`` cell ends, ``LivePublisher.finish`` posts its report's own
figure, the allocated bytes over the cell from the analysis's timeline, as
samples marked ``final``: the sidebar then draws what the report says (the
CPU's live figure is resident memory, another quantity) and marks the run
finished rather than leaving the last live line standing as if current.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

from torchlens.frontends.shared.rank_channel import MEMORY_SOURCES, RankPublisher
from torchlens.model.feed import RankFeed
from torchlens.model.messages import DdpHeartbeat
from torchlens.model.records import StepRecord, StepSummary
from torchlens.model.samples import PostedSample

Sample = list[PostedSample]

#: points of the report's allocated-memory series sent to the sidebar: a
#: chart a few hundred pixels wide; ``decimate`` keeps each bucket's peak
REPORT_POINTS = 240


class LivePublisher:
    """Context manager: a thread publishing ``sample()`` until the block ends."""

    def __init__(self, run: str, sample: Callable[[], Sample], interval: float = 0.5,
                 publisher: RankPublisher | None = None) -> None:
        self.publisher = publisher if publisher is not None else RankPublisher(run)
        self.sample = sample
        self.interval = interval
        self.sent = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                samples = self.sample()
            except Exception:  # a failing probe must not end the user's cell
                samples = []
            if self.publisher.publish(samples):
                self.sent += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> LivePublisher:
        self._started = time.time()
        if self.publisher.enabled:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="torchlens-live-publish")
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> bool:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval + self.publisher.timeout)
        self._ended = time.time()
        return False

    def finish(self, analysis: Callable[[], Any], device: int | None = None) -> bool:
        """Post the finished cell's report figures (``report_samples``) after the
        live ones. ``analysis`` is called only when a sidebar listens (the
        report computes it anyway and keeps it). Best effort like the loop: a
        failure here leaves the cell's result and its report as they are."""
        if not self.publisher.enabled:
            return False
        try:
            samples = report_samples(analysis(), self._started, getattr(self, "_ended", time.time()),
                                     device)
        except Exception:  # the report shows the analysis' own error; the cell goes on
            self.publisher.failures += 1
            return False
        return self.publisher.publish(samples)


class RankSink:
    """The ``RankFeed`` of ``%ddp_check``: forwards every rank's memory to the
    sidebar (at most every ``interval`` s) and passes everything on to ``inner``
    (the live view, itself a ``RankFeed``, or None).

    ``make_inner`` builds ``inner`` in ``start()``, which the launcher calls
    once the ranks are spawned: a cold kernel's live plot costs about a second
    of bokeh imports, which then overlaps the ranks' own torch import instead
    of delaying their start."""

    def __init__(self, run: str, inner: RankFeed | None = None, interval: float = 0.5,
                 publisher: RankPublisher | None = None,
                 make_inner: Callable[[], RankFeed] | None = None) -> None:
        self.inner = inner
        self._make_inner = make_inner
        self.publisher = publisher if publisher is not None else RankPublisher(run)
        self.interval = interval
        self._pending: list[PostedSample] = []
        self._last = 0.0

    def start(self) -> None:
        """The ranks are starting: build the live view now (see the class doc)."""
        if self._make_inner is not None and self.inner is None:
            self.inner = self._make_inner()
        if self.inner is not None:
            self.inner.start()

    def push(self, hb: DdpHeartbeat) -> None:
        if self.inner is not None:
            self.inner.push(hb)
        if self.publisher.enabled:
            cuda = hb.cuda_allocated
            self._pending.append(PostedSample(
                rank=hb.rank, t=float(hb.t or 0.0),
                device=_device_index(hb.device) if cuda is not None else None,
                allocated=cuda if cuda is not None else hb.rss,
                reserved=hb.cuda_reserved))

    def push_memory(self, rank: int, mem: dict[str, Any], t: float,
                    device: int | None = None) -> None:
        """Queue one rank's allocator figures for the sidebar (``--profile``).

        ``mem`` is a step record's ``mem`` or a profiled-step summary's
        ``memory`` (docs/RANK_PROFILE.md): ``allocated``, ``reserved``,
        ``inactive_split``, ``largest_free`` and ``source`` (``cuda``,
        ``modelled`` or ``rss``) travel as they are, ``t`` is the step's end.
        On ``rss`` the resident memory is sent as ``allocated``, as ``push``
        does on CPU, so the chart's line stays one quantity. A value that is not
        a number (or a source outside that set) is sent as null: one odd field
        must not make the server refuse the batch it travels in.
        """
        if not self.publisher.enabled:
            return
        source = mem.get("source")
        source = source if source in MEMORY_SOURCES else None
        allocated = mem.get("allocated")
        if allocated is None and source == "rss":
            allocated = mem.get("rss")
        self._pending.append(PostedSample(
            rank=int(rank), t=float(t),
            device=device if isinstance(device, int) and not isinstance(device, bool) else None,
            allocated=_bytes(allocated), reserved=_bytes(mem.get("reserved")),
            inactive_split=_bytes(mem.get("inactive_split")),
            largest_free=_bytes(mem.get("largest_free")), source=source))

    def push_steps(self, rank: int, records: list[StepRecord]) -> None:
        """``--profile`` step records: all to the live view, the newest one's memory
        to the sidebar (a batch can hold hundreds of short steps)."""
        if self.inner is not None:
            self.inner.push_steps(rank, records)
        last = next((r for r in reversed(records) if r.mem is not None), None)
        if last is not None and last.mem is not None:
            self.push_memory(rank, last.mem.to_dict(), last.t1)

    def push_summary(self, rank: int, summary: StepSummary) -> None:
        """A profiled step's summary: to the live view; its (modelled) memory to the sidebar."""
        if self.inner is not None:
            self.inner.push_summary(rank, summary)
        memory = summary.get("memory")
        if isinstance(memory, dict):
            self.push_memory(rank, memory, float(summary.get("t1") or 0.0))

    def rank_ended(self, rank: int, reason: str, t: float | None) -> None:
        if self.inner is not None:
            self.inner.rank_ended(rank, reason, t)

    def flush(self, force: bool = False) -> None:
        if self.inner is not None:
            self.inner.flush(force) if force else self.inner.flush()
        now = time.monotonic()
        if self._pending and (force or now - self._last >= self.interval):
            self._last = now
            samples, self._pending = self._pending, []
            self.publisher.publish(samples)

    def close(self) -> None:
        """The run is over: the live view ends what it holds open (the terminal's line)."""
        if self.inner is not None:
            self.inner.close()


def _device_index(device: str | None) -> int | None:
    """The CUDA ordinal of a heartbeat's device ("cuda:1" -> 1; None when it names none)."""
    _, _, index = (device or "").rpartition(":")
    return int(index) if index.isdigit() else None


def _bytes(value: Any) -> int | None:
    """A byte count as an int, or None for null or anything that is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


def report_samples(analysis: Any, started: float, ended: float,
                   device: int | None = None) -> list[PostedSample]:
    """A finished ``%%gpumem`` cell's report figure as rank-0 samples marked ``final``.

    ``analysis`` is the cell's ``MemoryAnalysis``: its timeline's allocated bytes
    (what the report's memory chart draws, the state at the start first) at
    most ``REPORT_POINTS`` points (``decimate`` keeps each bucket's highest, so
    the peak is drawn), and its ``peak_allocated`` (the report's "peak ...
    allocated") on every sample. Times are the trace's own (epoch
    microseconds) when it has them; a trace with entries only (``clock ==
    "entry"``) is spread over the cell's wall time, ``started`` to ``ended``.
    """
    from torchlens.analysis.memory.timeline import decimate

    tl = analysis.timeline
    t_us, alloc = decimate(tl.t_us, tl.allocated, max_points=REPORT_POINTS)
    if tl.clock == "us" and tl.t0_us:
        times = [(tl.t0_us + t) / 1e6 for t in t_us]
        first = times[0] if times else started
    else:
        span = max(t_us[-1], 1) if t_us else 1
        times = [started + (ended - started) * t / span for t in t_us]
        first = started
    # the sidebar draws one value per time: events of one microsecond keep their
    # highest, so the peak is never hidden behind a free at the same instant
    level: dict[float, int] = {min(first, started): tl.start_allocated}
    for t, a in zip(times, alloc, strict=True):
        level[t] = max(level.get(t, 0), int(a))
    if len(level) == 1:  # nothing allocated or freed: the start is the end
        level[max(ended, first + 1e-3)] = tl.end_allocated
    last = max(level)
    if level[last] != tl.end_allocated:  # the last instant kept its highest: end on the end
        level[max(ended, last + 1e-6)] = tl.end_allocated
    return [PostedSample(rank=0, t=t, device=device, allocated=a, reserved=None,
                         peak=int(tl.peak_allocated), final=True)
            for t, a in sorted(level.items())]
