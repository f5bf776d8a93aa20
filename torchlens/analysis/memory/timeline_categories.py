"""Allocated memory over time split by category: the stacked timeline (pure, no torch).

Every point of the stack is a point of the plain timeline (``MemoryTimeline``),
and its categories add up to that point's ``allocated`` exactly: each event's
change of allocated bytes is booked to the category of the block it allocates
or frees (``PeakAnalysis.entry_categories``, the same categories the peak
section lists), never re-derived from sizes. So the rounding of a snapshot's
blocks, a wrapped history's base and the CPU capture's inferred start all
carry over unchanged. The start is split the way the peak splits memory alive
before the window: blocks the trace frees later (by their free's stack),
blocks the segments still hold and the trace never touches, and the rest,
unattributed (which may be negative when the segments name more than the
start held).

A big trace is thinned to at most ``max_points`` points by keeping, per
bucket, the points of least and most allocated (``kept_points``), plus the
first, the last and the peak: a kept point keeps its exact figures, so the
peak is drawn at its exact height and every drawn stack still adds up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from torchlens.analysis.memory import categories as cat
from torchlens.analysis.memory.peak import KEPT, UNATTRIBUTED, PeakAnalysis
from torchlens.analysis.memory.timeline import MemoryTimeline

MAX_POINTS = 4000

#: memory alive before the window: the floor of the stack, under the window's own
_BEFORE_ORDER = ("alive before the window (no stack)", UNATTRIBUTED)
#: torchlens' categories, longest-lived lowest: parameters and optimizer state stay flat
#: while gradients come and go each step above them (the table order puts gradients
#: second, which would lift the optimizer state every time they appear)
STACK_ORDER = (cat.PARAMETER, cat.OPTIMIZER, cat.GRADIENT, cat.ACTIVATION, cat.BACKWARD,
               cat.OPTIMIZER_TEMP, cat.INPUT, cat.UNKNOWN, cat.NO_STACK)


@dataclass
class CategorySeries:
    """Allocated bytes per category at each kept point of a timeline (bottom of the
    stack first). Point 0 is the window's start (x 0); ``x`` is in the timeline's
    ``t_us`` units (``clock``)."""

    names: list[str]
    x: list[int]
    bytes: dict[str, list[int]]
    total: list[int]  # the timeline's allocated at each point: the stack's sum
    reserved: list[int]
    peak_point: int  # the kept point at the peak (the timeline's first point at it)
    events: int  # the timeline's points before thinning (the start included)
    clock: str = "us"
    inferred: bool = True  # categories come from stacks (``categories.INFERRED``)
    #: bytes per category at the start (memory alive before the window)
    start: dict[str, int] = field(default_factory=dict)

    def at(self, point: int) -> dict[str, int]:
        """Bytes per category at one kept point."""
        return {n: self.bytes[n][point] for n in self.names}


def kept_points(values: list[int], max_points: int, must: tuple[int, ...] = ()) -> list[int]:
    """Sorted indices of at most about ``max_points`` points of ``values``: per bucket
    its least and greatest, the first and last point and ``must`` (a few more)."""
    n = len(values)
    if n <= max_points:
        return list(range(n))
    bucket = -(-n // max(1, max_points // 2))
    # buckets as rows; the last row padded with the last value (argmin/argmax take the
    # first of equals, so a pad is never picked over the real point it copies)
    v = np.asarray(values, dtype=np.int64)
    rows = np.concatenate([v, np.full(-n % bucket, v[-1])]).reshape(-1, bucket)
    base = np.arange(rows.shape[0]) * bucket
    keep = {0, n - 1, *(i for i in must if 0 <= i < n)}
    keep.update((base + rows.argmin(axis=1)).tolist())
    keep.update((base + rows.argmax(axis=1)).tolist())
    return sorted(i for i in keep if i < n)


def _order(names: set[str]) -> list[str]:
    """Stacking order, bottom first: memory alive before the window (constant or falling,
    a floor the window's memory stands on), the user's own categories, then torchlens'
    in ``STACK_ORDER`` (parameters low, the unknown ones on top)."""
    order = STACK_ORDER + tuple(n for n in cat.ORDER if n not in STACK_ORDER)
    known = [n for n in order if n in names]
    before = [n for n in _BEFORE_ORDER if n in names]
    custom = sorted(names - set(known) - set(before))
    return before + custom + known


def category_series(tl: MemoryTimeline, pk: PeakAnalysis,
                    max_points: int = MAX_POINTS) -> CategorySeries | None:
    """The stacked timeline of ``tl`` in ``pk``'s categories; None without events
    (no history: there is nothing to split)."""
    if not tl.index or not pk.entry_categories:
        return None
    allocated = [tl.start_allocated, *tl.allocated]
    reserved = [tl.start_reserved, *tl.reserved]
    # the peak section's moment: the first event at the peak, the start only when no
    # event reaches it
    peak = max(allocated)
    peak_point = tl.allocated.index(peak) + 1 if peak in tl.allocated else 0
    keep = kept_points(allocated, max_points, (peak_point,))
    # what each event changes: the timeline's own step, booked to its block's category
    step = np.diff(np.asarray(allocated, dtype=np.int64))  # step[j - 1]: point j's change
    # each event's category as a code, looked up by trace entry in one array (a big
    # trace has a million events: no Python work per event)
    entry_cat = pk.entry_categories
    labels = sorted(set(entry_cat.values()) | {UNATTRIBUTED})
    code = {n: k for k, n in enumerate(labels)}
    index = np.asarray(tl.index, dtype=np.int64)
    keys = np.fromiter(entry_cat, dtype=np.int64, count=len(entry_cat))
    lut = np.full(int(max(index.max(), keys.max())) + 1, code[UNATTRIBUTED], dtype=np.int64)
    lut[keys] = np.fromiter(map(code.__getitem__, entry_cat.values()), dtype=np.int64,
                            count=len(entry_cat))
    event = lut[index]  # event[j - 1]: point j's category
    start: dict[str, int] = {}
    # blocks alive at the start and freed in the window (each such free is a point)
    for j in np.searchsorted(index, tl.unknown_free_index).tolist():
        name = labels[event[j]]
        start[name] = start.get(name, 0) - int(step[j])
    for b in pk.blocks:
        if b.origin == KEPT:
            start[b.category] = start.get(b.category, 0) + b.size
    rest = tl.start_allocated - sum(start.values())
    if rest:
        start[UNATTRIBUTED] = start.get(UNATTRIBUTED, 0) + rest
    moved = {labels[k] for k in np.unique(event[step != 0]).tolist()}
    names = _order(moved | {n for n, v in start.items() if v})
    at = np.asarray(keep, dtype=np.int64)
    series: dict[str, list[int]] = {}
    for n in names:
        # the category's level at point p: its start plus its events' steps up to p
        level = np.concatenate([[0], np.cumsum(np.where(event == code.get(n, -1), step, 0))])
        series[n] = (start.get(n, 0) + level[at]).tolist()
    x = [0, *tl.t_us]
    return CategorySeries(names, [x[i] for i in keep], series, [allocated[i] for i in keep],
                          [reserved[i] for i in keep], keep.index(peak_point), len(allocated),
                          tl.clock, start=start)
