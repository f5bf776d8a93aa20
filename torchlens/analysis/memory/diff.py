"""The diff of two memory results (``torchlens diff A.pickle B.pickle``,
``result.diff(other)`` on a ``%%gpumem`` result or a loaded snapshot).

Inputs are the two ``MemoryAnalysis`` objects; the diff is one ``MemoryDiff``
(``model.memory_figures``; it is saved as computed, like the trace diff). Definitions (bytes):

- ``figures``: peak, start and end allocated of each side, as its report
  shows them (the timeline's: block rounding on a snapshot, requested sizes
  on the CPU), ``delta`` = B - A and ``pct`` = 100 * delta / A.
- ``categories`` and ``sites``: what was alive at each side's peak
  (``analysis.memory.peak``), grouped by inferred category and by site (the
  user's line): ``a_bytes``, ``b_bytes``, ``delta``, ``delta_pct`` and a
  ``status`` from ``analysis.changes.change_status``: ``added`` (alive at B's
  peak only), ``removed``, ``same`` within ``same_pct`` (5%) of A's bytes,
  ``small`` beyond that but within ``small_share`` (1%) of the larger peak,
  else ``grew`` or ``shrank``. The bytes of each side add up to its peak, so
  the category deltas add up to the peak's change.
- ``timelines``: each side's allocated memory over its window, decimated,
  on one x axis: ms since each side's first event when both have times,
  else each window's share (0-100%), said in ``x_label``.
- ``verdict``: the peak's change, then what grew most (by category and by
  site) when the peak grew, what shrank most when it fell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchlens.analysis.changes import change_status
from torchlens.analysis.memory.peak import GroupRow, PeakAnalysis
from torchlens.analysis.memory.timeline import MemoryTimeline, decimate
from torchlens.model.findings import INFO, PASSED, WARNING, Figure, Finding
from torchlens.model.memory_figures import (
    MEMORY_DIFF,
    ChangeRow,
    DiffFigures,
    DiffSide,
    DiffSides,
    DiffThresholds,
    DiffTimelines,
    FigureChange,
    MadeBy,
    MemoryDiff,
    Series,
)
from torchlens.model.payloads import MemoryDiffPayload
from torchlens.model.units import format_bytes, format_percent

if TYPE_CHECKING:  # annotations only
    from torchlens.analysis.memory.analyze import MemoryAnalysis
    from torchlens.model import Profile

SAME_PCT = 5.0
SMALL_SHARE = 0.01  # of the larger peak
STATUSES = ("added", "removed", "grew", "shrank", "small", "same")
CHANGED = ("added", "removed", "grew", "shrank")
TIMELINE_POINTS = 2000


def _figure(a: int, b: int) -> FigureChange:
    return FigureChange(a, b, b - a, 100.0 * (b - a) / a if a else None)


def _rows(ra: list[GroupRow], rb: list[GroupRow], same_pct: float,
          small: float) -> list[ChangeRow]:
    a = {r.name: r for r in ra}
    b = {r.name: r for r in rb}
    rows = []
    for name in set(a) | set(b):
        x, y = a.get(name), b.get(name)
        ab, bb = (x.bytes if x else 0), (y.bytes if y else 0)
        either = y or x
        assert either is not None
        rows.append(ChangeRow(
            name, change_status(ab, bb, in_a=x is not None, in_b=y is not None,
                                same_pct=same_pct, small=small, up="grew", down="shrank"),
            ab, bb, bb - ab, 100.0 * (bb - ab) / ab if ab else None,
            either.categories, either.function))
    rows.sort(key=lambda r: (-abs(r.delta), r.name))
    return rows


def _series(tl: MemoryTimeline, timed: bool) -> Series:
    """Allocated over the window, the start first, on the shared x axis."""
    t, alloc = decimate(tl.t_us, tl.allocated, max_points=TIMELINE_POINTS)
    t, alloc = [0, *t], [tl.start_allocated, *alloc]
    span = max(t[-1], 1)
    return Series([v / 1000 if timed else 100.0 * v / span for v in t], alloc)


def _side(label: str, a: MemoryAnalysis) -> DiffSide:
    pk: PeakAnalysis = a.peak
    t = pk.trigger
    return DiffSide(label, a.measured_on, a.timeline.clock, pk.known, len(a.trace),
                    None if t is None else MadeBy(t.size, t.site, t.category),
                    list(pk.missing))


def diff_memory(a: MemoryAnalysis, b: MemoryAnalysis, *, same_pct: float = SAME_PCT,
                small_share: float = SMALL_SHARE) -> MemoryDiff:
    """The diff of memory analysis ``b`` against ``a`` (two ``MemoryAnalysis``)."""
    ta, tb = a.timeline, b.timeline
    figures = DiffFigures(_figure(ta.peak_allocated, tb.peak_allocated),
                          _figure(ta.start_allocated, tb.start_allocated),
                          _figure(ta.end_allocated, tb.end_allocated))
    small = small_share * max(ta.peak_allocated, tb.peak_allocated)
    pa, pb = a.peak, b.peak
    categories = _rows(pa.by_category, pb.by_category, same_pct, small)
    sites = _rows(pa.by_site, pb.by_site, same_pct, small)
    notes = []
    for label, an in (("A", a), ("B", b)):
        if not an.peak.known:
            notes.append(f"{label}: what was alive at its peak is unknown ("
                         + (an.peak.missing[0] if an.peak.missing else "no history")
                         + "): its categories and sites are left out")
    if a.measured_on != b.measured_on and "cpu" in (a.measured_on, b.measured_on):
        notes.append("one side is a CPU capture (requested sizes, no block rounding), the "
                     "other a GPU snapshot: their bytes are not counted alike")
    if pa.category_from != pb.category_from:
        notes.append(f"A's categories are {pa.category_from}, B's {pb.category_from}: a "
                     "category's change may be a change of who named it")
    timed = ta.clock == tb.clock == "us"
    if not timed:
        notes.append("a side's snapshot records no times: both timelines are drawn over "
                     "their window's share (0-100%), not time")
    out = MemoryDiff(
        thresholds=DiffThresholds(same_pct, small_share, int(small)), figures=figures,
        categories=categories, sites=sites, category_from=pa.category_from if pa.category_from == pb.category_from
        else f"A: {pa.category_from}; B: {pb.category_from}",
        category_note=pa.category_note if pa.category_note == pb.category_note
        else f"A: {pa.category_note} B: {pb.category_note}",
        summary={s: sum(r.status == s for r in categories) for s in STATUSES},
        sides=DiffSides(_side("A", a), _side("B", b)),
        timelines=DiffTimelines("ms since the first event" if timed else
                                "share of the recorded window (%)",
                                _series(ta, timed) if ta.t_us else None,
                                _series(tb, timed) if tb.t_us else None),
        notes=notes)
    out.verdict = verdict(out)
    return out


def regressed(diff: MemoryDiff, pct: float) -> bool | None:
    """Whether B's peak is more than ``pct`` % above A's (None: A's peak is 0)."""
    p = diff.figures.peak.pct
    return None if p is None else p > pct


def _named(rows: list[ChangeRow], grew: bool) -> ChangeRow | None:
    moved = [r for r in rows if r.status in (("grew", "added") if grew else
                                            ("shrank", "removed"))]
    if not moved:
        return None
    return max(moved, key=lambda r: r.delta) if grew else min(moved, key=lambda r: r.delta)


def verdict(diff: MemoryDiff) -> Finding:
    """The peak's change and what made it, in one sentence: a warning when B's
    peak is more than ``same_pct`` above A's."""
    p = diff.figures.peak
    same_pct = diff.thresholds.same_pct
    head = (f"peak allocated {format_bytes(p.a)} -> {format_bytes(p.b)} "
            f"({format_bytes(p.delta, signed=True)}"
            + (f", {format_percent(p.pct, signed=True)})" if p.pct is not None else ")"))
    figures = [Figure("a_peak", p.a, "B"), Figure("b_peak", p.b, "B"),
               Figure("peak_delta", p.delta, "B")]
    if p.pct is None:
        severity = INFO
    else:
        severity = WARNING if p.pct > same_pct else PASSED
        if abs(p.pct) <= same_pct:
            head += f": the same within {same_pct:g}%"
    grew = p.delta > 0
    parts = []
    for what, rows in (("category", diff.categories), ("site", diff.sites)):
        r = _named(rows, grew)
        if r is not None:
            parts.append(f"{r.name} {format_bytes(r.delta, signed=True)}"
                         + (f" ({r.status})" if r.status in ("added", "removed") else ""))
            figures.append(Figure(f"largest_{what}_change", r.delta, "B"))
    if parts:
        tail = ("; most growth at the peak: " if grew else "; most fall at the peak: ") \
            + ", at ".join(parts)
    elif p.delta:
        tail = "; no category or site changed beyond the thresholds"
    else:
        tail = ""
    return Finding(severity, head + tail, tuple(figures), code=MEMORY_DIFF)


def analyze(profile: Profile) -> MemoryDiff:
    """The analysis of a ``memdiff`` Profile: the diff it holds, made when it was made."""
    payload = profile.payload
    assert isinstance(payload, MemoryDiffPayload)
    return payload.diff
