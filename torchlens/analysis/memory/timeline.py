"""Memory over a cell, from a device trace in torch's snapshot format (pure, no torch).

The same functions serve a real CUDA snapshot and the CPU stand-in trace: a
list of entries with ``action`` (alloc, free_requested, free_completed,
segment_alloc/free/map/unmap, oom ...), ``addr``, ``size``, ``time_us`` and
``frames`` (innermost first). Reserved bytes change at the segment actions.

Allocated bytes follow torch's own ``allocated_bytes`` rule
(c10/cuda/CUDACachingAllocator.cpp): ``free()`` decreases ``allocated_bytes``
by the block's size and records ``free_requested``; ``free_completed`` comes
when the block is back in the pool, which with ``record_stream`` or a side
stream is later, after the stream's events. So allocated falls at
``free_requested``; a ``free_completed`` with none before it (the CPU
allocator's stand-in trace, older formats) is the free itself. Trace sizes are
what the program asked for, the stat counts the block (``block_size``: the
allocator's rounding; a block handed out whole, unsplit, is larger still).

Allocation sites are the innermost frame of *user* code: frames in torch,
site-packages, torchlens, the standard library, IPython/ipykernel and C++
frames are skipped, because "aten::addmm in linear.py" is the same for every
model and says nothing about which line of the notebook to change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate

from torchlens.analysis.frames import SiteMemo
from torchlens.formats.locations import CellNames
from torchlens.model.snapshot import Frame, TraceEntry

SEG_ADD = ("segment_alloc", "segment_map")
SEG_SUB = ("segment_free", "segment_unmap")


@dataclass
class Allocation:
    """One allocation of the trace, paired with its free (``t_free`` None: still alive)."""

    index: int
    addr: int
    size: int
    t_alloc: int
    t_free: int | None
    frames: list[Frame]
    site: str
    function: str
    i_free: int | None = None  # trace index of the free (orders frees when times tie)


@dataclass
class MemoryTimeline:
    """Allocated and reserved bytes after each event, with the cell's summary figures.

    ``clock`` says what ``t_us``, ``t0_us`` and the allocations' ``t_alloc`` /
    ``t_free`` count: ``"us"``, microseconds of the trace's ``time_us``; or
    ``"entry"``, the trace entry's index, when the trace has no times or all
    its times are equal (older snapshots), so events still spread out in order.
    """

    t_us: list[int] = field(default_factory=list)  # since the first event
    clock: str = "us"
    allocated: list[int] = field(default_factory=list)
    reserved: list[int] = field(default_factory=list)
    start_allocated: int = 0
    start_reserved: int = 0
    allocations: list[Allocation] = field(default_factory=list)
    unknown_frees: int = 0  # frees of blocks allocated before the trace began
    unknown_freed_bytes: int = 0  # their bytes: alive at the start, proven by those frees
    start_inferred: bool = False  # start_allocated was inferred from those frees
    t0_us: int = 0
    #: a peak known from elsewhere (memory_stats) when the trace cannot show it
    known_peak: int | None = None
    #: the trace entry of each point of ``t_us`` / ``allocated`` (``analysis.memory.peak``)
    index: list[int] = field(default_factory=list)
    #: the trace entries of the ``unknown_frees``
    unknown_free_index: list[int] = field(default_factory=list)

    @property
    def peak_allocated(self) -> int:
        """The most allocated at any point, the start included (a cell that only frees
        peaks at its start)."""
        return max(self.start_allocated, max(self.allocated, default=0), self.known_peak or 0)

    @property
    def end_allocated(self) -> int:
        return self.allocated[-1] if self.allocated else self.start_allocated

    @property
    def peak_reserved(self) -> int:
        return max(self.start_reserved, max(self.reserved, default=0))

    @property
    def end_reserved(self) -> int:
        return self.reserved[-1] if self.reserved else self.start_reserved


def build_timeline(
    trace: list[TraceEntry],
    *,
    start_allocated: int = 0,
    start_reserved: int = 0,
    reserved_steps: list[tuple[int, int]] | None = None,
    infer_start: bool = False,
    cells: CellNames | None = None,
    block_size: Callable[[int], int] | None = None,
) -> MemoryTimeline:
    """Walk the trace once: the allocated/reserved series and every allocation.

    ``reserved_steps`` replaces the trace's own segment actions with
    (event index, reserved bytes) pairs, e.g. from the allocator model when the
    trace comes from the CPU allocator (which reserves nothing).

    ``infer_start``: the trace gives no starting total (the CPU allocator's
    events), so the bytes alive at the start are inferred as the sum of the
    frees of blocks never allocated in the trace: each of them was alive when
    it began. Without that, a cell that frees tensors made before it would
    show negative allocated memory.

    ``cells`` names notebook cells in the sites (``frames.site_of``).
    ``block_size`` maps a requested size to the bytes the allocator counts for it
    (``allocator.config.round_size``); None counts the trace's sizes as they are.
    """
    tl = MemoryTimeline(start_allocated=start_allocated, start_reserved=start_reserved)
    sites = SiteMemo(cells)
    live: dict[int, Allocation] = {}
    pending: set[int] = set()  # free_requested seen, free_completed not yet
    counted = block_size or (lambda n: n)
    steps = dict(reserved_steps or [])
    times = [int(e.time_us or 0) for e in trace]
    t0 = next((t for t in times if t), 0)
    if len(trace) > 1 and (not t0 or max(times) == min(t for t in times if t)):
        tl.clock, times, t0 = "entry", list(range(len(trace))), 0
    tl.t0_us = t0
    # one point per event that changes a level: its entry and the two changes; the levels
    # are the running sums, taken after the walk (Python ints: no overflow)
    index, d_alloc, d_res = tl.index, [], []
    for i, e in enumerate(trace):
        action = e.action
        if action == "alloc":
            frames = e.frames
            site, fn = sites(frames)
            a = Allocation(i, e.addr, e.size, times[i] or t0, None, frames, site, fn)
            live[e.addr] = a
            tl.allocations.append(a)
            change, res = counted(e.size), 0
        elif action in ("free_completed", "free") and e.addr in pending:
            pending.discard(e.addr)  # back in the pool: allocated fell at the request
            change = res = 0
        elif action in ("free_requested", "free_completed", "free"):
            if action == "free_requested":
                pending.add(e.addr)
            a = live.pop(e.addr, None)
            if a is None:
                tl.unknown_frees += 1
                tl.unknown_free_index.append(i)
                change = counted(e.size)
                tl.unknown_freed_bytes += change
            else:
                a.t_free, a.i_free = times[i] or t0, i
                change = counted(a.size)
            change, res = -change, 0
        elif reserved_steps is None and action in SEG_ADD:
            change, res = 0, e.size
        elif reserved_steps is None and action in SEG_SUB:
            change, res = 0, -e.size
        elif i in steps:
            change = res = 0
        else:
            continue
        index.append(i)
        d_alloc.append(change)
        d_res.append(res)
    tl.t_us = [(times[i] or t0) - t0 for i in index]
    tl.allocated = list(accumulate(d_alloc, initial=start_allocated))[1:]
    if reserved_steps is None:
        tl.reserved = list(accumulate(d_res, initial=start_reserved))[1:]
    else:  # the model's level from its last step at or before each point
        level, tl.reserved = start_reserved, []
        for i in index:
            level = steps.get(i, level)
            tl.reserved.append(level)
    if infer_start and tl.unknown_freed_bytes:
        base = tl.unknown_freed_bytes
        tl.start_allocated += base
        tl.allocated = [v + base for v in tl.allocated]
        tl.start_inferred = True
    return tl


def rebase(tl: MemoryTimeline, start_allocated: int, start_reserved: int) -> MemoryTimeline:
    """``tl`` built from 0 moved to start at the given levels: every point of both series
    is the start plus the trace's running change, so building once from 0 and shifting
    gives what building again from these starts would, without walking the trace twice."""
    da, dr = start_allocated - tl.start_allocated, start_reserved - tl.start_reserved
    tl.start_allocated, tl.start_reserved = start_allocated, start_reserved
    if da:
        tl.allocated = [v + da for v in tl.allocated]
    if dr:
        tl.reserved = [v + dr for v in tl.reserved]
    return tl


def biggest_allocations(tl: MemoryTimeline, n: int = 10) -> list[Allocation]:
    """The ``n`` largest allocations of the cell, largest first."""
    return sorted(tl.allocations, key=lambda a: (-a.size, a.index))[:n]


@dataclass
class SiteRow:
    """Bytes allocated from one source line over the cell."""

    site: str
    function: str
    bytes: int
    count: int
    largest: int
    alive_bytes: int  # of them, still allocated at the end
    example: list[Frame]


def top_sites(tl: MemoryTimeline, n: int = 15) -> list[SiteRow]:
    """Allocation sites by total bytes allocated in the cell (largest first)."""
    rows: dict[str, SiteRow] = {}
    for a in tl.allocations:
        r = rows.get(a.site)
        if r is None:
            r = rows[a.site] = SiteRow(a.site, a.function, 0, 0, 0, 0, a.frames)
        r.bytes += a.size
        r.count += 1
        r.largest = max(r.largest, a.size)
        if a.t_free is None:
            r.alive_bytes += a.size
    return sorted(rows.values(), key=lambda r: (-r.bytes, r.site))[:n]


def alive_at(tl: MemoryTimeline, index: int, n: int = 3) -> list[tuple[str, int, int]]:
    """(site, bytes, tensors) of the ``n`` sites holding the most memory just before
    trace entry ``index`` (allocated before it and not yet freed)."""
    rows: dict[str, list[int]] = {}
    for a in tl.allocations:
        if a.index >= index:
            break
        if a.i_free is None or a.i_free >= index:
            r = rows.setdefault(a.site, [0, 0])
            r[0] += a.size
            r[1] += 1
    return sorted(((s, b, c) for s, (b, c) in rows.items()), key=lambda x: (-x[1], x[0]))[:n]


def x_of(tl: MemoryTimeline, trace: list[TraceEntry], index: int) -> int:
    """Where trace entry ``index`` lies on the timeline's x axis (``t_us``'s units)."""
    if tl.clock == "entry" or not trace:
        return index
    e = trace[min(index, len(trace) - 1)]
    return max(0, int(e.time_us or tl.t0_us) - tl.t0_us)


def live_bytes_at(tl: MemoryTimeline, t_abs_us: int) -> int:
    """Allocated bytes at absolute time ``t_abs_us`` (the last event at or before it)."""
    rel = t_abs_us - tl.t0_us
    value = tl.start_allocated
    for t, v in zip(tl.t_us, tl.allocated, strict=True):
        if t > rel:
            break
        value = v
    return value


def decimate(t: list[int], *series: list[int], max_points: int = 4000) -> tuple[list[int], ...]:
    """At most ``max_points`` points per series, keeping each bucket's min and max.

    A step plot of 100k events cannot show more than a few thousand distinct
    x pixels; keeping the extremes of each bucket keeps every peak visible, and
    the first and last points keep the axis and the end value.
    """
    n = len(t)
    if n <= max_points:
        return (list(t), *(list(s) for s in series))
    bucket = -(-n // (max_points // 2))
    keep: list[int] = []
    main = series[0] if series else t
    for start in range(0, n, bucket):
        end = min(n, start + bucket)
        chunk = range(start, end)
        lo = min(chunk, key=main.__getitem__)
        hi = max(chunk, key=main.__getitem__)
        keep += sorted({lo, hi} | {i for i in (0, n - 1) if start <= i < end})
    return ([t[i] for i in keep], *([s[i] for i in keep] for s in series))
