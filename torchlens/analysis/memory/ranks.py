"""A set of per-rank snapshots as one result: each rank's peak, when it was and what
it was made of, and the imbalance named.

Input: ``{rank: MemoryAnalysis}`` (each rank's snapshot analysed alone, its peak
by ``analysis.memory.peak``). Definitions (bytes):

- Per rank: ``peak`` (its timeline's peak allocated), ``x`` (when: µs since its
  first event, or the trace entry when the snapshot has no times), the
  category and site holding the most bytes at its peak, ``end`` allocated.
- ``median_peak``: the median of the ranks' peaks; the imbalanced rank is the
  one with the highest peak, ``above_median`` = its peak - the median.
- ``compared_with``: what a rank's peak is set against in the views: the median,
  or with two ranks the other rank (their median is their mean, a figure no rank
  had). ``above`` (the imbalance's, and each row's): the peak less that.
- What makes the difference: per category (and per site) the rank's bytes at
  its peak less the median over the other ranks of theirs (0 where a rank
  has none); the category and the site with the largest excess are named.
- The imbalance counts when ``above`` is more than ``same_pct`` (5%)
  of the median and more than ``small_share`` (1%) of the highest peak, the
  thresholds of ``torchlens diff`` (``analysis.changes``).
- ``timelines``: every rank's allocated memory, decimated, on one x axis (ms
  since each rank's first event; each window's share when a rank has no times).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from torchlens.analysis.memory.diff import SAME_PCT, SMALL_SHARE
from torchlens.analysis.memory.peak import GroupRow
from torchlens.analysis.memory.timeline import decimate
from torchlens.model.findings import INFO, PASSED, WARNING, Figure, Finding
from torchlens.model.memory_figures import (
    MEMORY_RANKS,
    Excess,
    Imbalance,
    MemoryRanks,
    RankPeak,
    RankThresholds,
    RankTimelines,
    Series,
    Top,
)
from torchlens.model.payloads import MemoryRanksPayload

if TYPE_CHECKING:  # annotations only
    from torchlens.analysis.memory.analyze import MemoryAnalysis
    from torchlens.model import Profile
from torchlens.model.units import format_bytes

POINTS_PER_RANK = 1000
MAX_DRAWN = 64  # ranks drawn on the chart (the highest peaks); the table holds every rank


def _top(rows: list[GroupRow]) -> Top | None:
    return Top(rows[0].name, rows[0].bytes) if rows else None


def _excess(mine: list[GroupRow], others: list[list[GroupRow]]) -> Excess | None:
    """The group this rank holds most more of than the median other rank."""
    best = None
    for r in mine:
        typical = statistics.median([next((o.bytes for o in rows if o.name == r.name), 0)
                                     for rows in others]) if others else 0
        extra = r.bytes - typical
        if best is None or extra > best.extra:
            best = Excess(r.name, r.bytes, int(extra))
    return best if best and best.extra > 0 else None


def _series(a: MemoryAnalysis, timed: bool) -> Series | None:
    tl = a.timeline
    if not tl.t_us:
        return None
    t, alloc = decimate(tl.t_us, tl.allocated, max_points=POINTS_PER_RANK)
    t, alloc = [0, *t], [tl.start_allocated, *alloc]
    span = max(t[-1], 1)
    return Series([v / 1000 if timed else 100.0 * v / span for v in t], alloc)


def analyze_ranks(ranks: dict[int, MemoryAnalysis], sources: dict[int, str], *,
                  same_pct: float = SAME_PCT, small_share: float = SMALL_SHARE) -> MemoryRanks:
    """The per-rank table, the imbalance and the timelines (see the module doc)."""
    rows = []
    for rank in sorted(ranks):
        a = ranks[rank]
        pk, tl = a.peak, a.timeline
        rows.append(RankPeak(rank, sources.get(rank, ""), tl.peak_allocated,
                             pk.x if pk.entry is not None else None, tl.clock, pk.entry,
                             _top(pk.by_category), _top(pk.by_site), tl.end_allocated,
                             len(a.trace), list(pk.missing)))
    peaks = [r.peak for r in rows]
    median = float(statistics.median(peaks)) if peaks else 0.0
    worst = max(rows, key=lambda r: (r.peak, -r.rank)) if rows else None
    notes = [f"rank {r.rank}: {r.missing[0]}" for r in rows if r.missing]
    timed = all(ranks[r].timeline.clock == "us" for r in ranks)
    if not timed:
        notes.append("a rank's snapshot records no times: the timelines are drawn over each "
                     "window's share (0-100%), not time")
    pair = len(rows) == 2
    for r in rows:
        r.above = r.peak - (next(o.peak for o in rows if o is not r) if pair else median)
    drawn = sorted(rows, key=lambda r: -r.peak)[:MAX_DRAWN]
    out = MemoryRanks(
        RankThresholds(same_pct, small_share), rows, median, notes,
        compared_with="the other rank" if pair else "median",
        timelines=RankTimelines("ms since each rank's first event" if timed else
                                "share of the recorded window (%)",
                                {str(r.rank): _series(ranks[r.rank], timed)
                                 for r in sorted(drawn, key=lambda r: r.rank)},
                                max(0, len(rows) - MAX_DRAWN)))
    if worst is not None and len(rows) > 1:
        others = [ranks[r].peak for r in ranks if r != worst.rank]
        mine = ranks[worst.rank].peak
        out.imbalance = Imbalance(
            worst.rank, worst.peak, int(worst.peak - median), int(worst.above or 0),
            next(r for r in rows if r is not worst).rank if pair else None,
            _excess(mine.by_category, [p.by_category for p in others]),
            _excess(mine.by_site, [p.by_site for p in others]))
    out.verdict = verdict(out)
    return out


def verdict(d: MemoryRanks) -> Finding:
    """The imbalance in one sentence: which rank peaks how far above the median (with two
    ranks: above the other), and the category and site that hold the difference."""
    rows, im = d.ranks, d.imbalance
    if not rows:
        return Finding(INFO, "no rank snapshot could be read", code=MEMORY_RANKS)
    if im is None:
        r = rows[0]
        return Finding(INFO, f"one rank (rank {r.rank}) peaks at {format_bytes(r.peak)}: "
                             "nothing to compare it with", (Figure("peak", r.peak, "B"),),
                       code=MEMORY_RANKS)
    median = d.median_peak
    other = im.reference  # with two ranks: the other one (older results: None)
    above = im.above if im.above is not None else im.above_median
    base = im.peak - above
    th = d.thresholds
    figures = [Figure("rank", im.rank), Figure("peak", im.peak, "B"),
               Figure("median_peak", int(median), "B"), Figure("above_median", above, "B")]
    if other is not None:
        figures[2:] = [Figure("other_rank_peak", int(base), "B"),
                       Figure("above_other_rank", above, "B")]
    notable = above > th.same_pct / 100 * base and above > th.small_share * im.peak
    if not notable:
        within = ("of each other" if other is not None else
                  f"of the median ({format_bytes(median)})")
        return Finding(PASSED, f"{len(rows)} ranks peak within {format_bytes(above)} "
                               f"{within}: no rank stands out", tuple(figures),
                       code=MEMORY_RANKS)
    than = f"rank {other}" if other is not None else f"the median of {len(rows)} ranks"
    head = (f"rank {im.rank} peaks {format_bytes(above)} above {than} "
            f"({format_bytes(im.peak)} vs {format_bytes(base)})")
    c, s = im.category, im.site
    over = f"rank {other}" if other is not None else "the median other rank"
    if c and s:
        head += (f": {c.name} at {s.name} ({format_bytes(c.extra, signed=True)} "
                 f"{c.name} and {format_bytes(s.extra, signed=True)} at that site "
                 f"over {over})")
    elif c:
        head += (f": {c.name} ({format_bytes(c.extra, signed=True)} over "
                 f"{over if other is not None else 'the median'})")
    return Finding(WARNING, head, tuple(figures), code=MEMORY_RANKS)


def analyze(profile: Profile) -> MemoryRanks:
    """The analysis of a ``memranks`` Profile: the figures made when it was loaded."""
    payload = profile.payload
    assert isinstance(payload, MemoryRanksPayload)
    return payload.analysis
