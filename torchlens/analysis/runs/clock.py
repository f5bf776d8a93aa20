"""Clock alignment across ranks: the offset of each rank's clock to the lowest
rank's, found from the ends of the collectives they share.

Why the ends: a collective cannot finish on any rank before the last rank has
arrived and its data has been exchanged, so every rank leaves it at about the
same moment whatever time it arrived. The arrivals differ by real waiting;
the ends differ by the clocks (ranks on different hosts) plus a little
completion jitter (a ring finishes on its ranks a few µs apart).

Definitions (``clock_rows``)
---------------------------
- Matched collectives are ``collectives.collective_rows``' compared rows
  (same ``(trace, seq)``, the ranks agree on name and size); the end of a
  collective on a rank is its ``t1`` (the end of its last host span, gloo/nccl
  span or NCCL kernel, unix seconds).
- The reference is the lowest rank read. For rank r, each collective it shares
  with the reference gives ``d = end_r - end_ref`` (µs); its ``offset_us`` is
  the median of the ``d`` (robust: a collective that ended late on one rank,
  e.g. a slow kernel tail, does not move it). ``aligned time = time - offset``.
- ``residual`` of a collective = ``d - offset_us``: what aligning leaves;
  ``residual_median_us`` / ``residual_max_us`` are the median and the largest
  ``|residual|`` of the rank (the reference: 0, by definition).
- ``collectives``: how many collectives the rank shares with the reference;
  ``offset_us`` is ``None`` when it shares none.
- ``applied`` (the decision below).

When the offsets are applied to arrivals and waits
--------------------------------------------------
Never when the traces say every rank ran on one host (their ``host_name``,
written by torch 2.4 and later, all equal): one machine has one clock, so
any offset found is completion jitter or a rank that leaves collectives
late, not a clock; ``applied`` is False and ``host`` says why. Otherwise
only when they are larger than the collectives' own spread explains: a rank's
offset is applied when ``|offset_us| > APPLY_MIN_US`` (5 µs: below that,
nothing a report shows would change) and ``|offset_us| > APPLY_FACTOR`` (3)
times its ``residual_median_us`` (the ends' own jitter, e.g. a NCCL ring's
completion on one node). Even a 10 µs offset left in place reads as a
slow rank over many collectives (seen on synthetic rank sets shifted by
10 µs per rank: "rank 1 arrived last at 100% of allreduces"). Why not always: ranks on one host share
one clock, and there the median end difference is jitter, not a clock
offset; subtracting it would move every arrival by noise and could flip
which rank arrived last. Why not never: ranks on different hosts whose
clocks differ by more than a collective's duration would otherwise read as
slow ranks (the late clock "arrives last" every time). What ends alone cannot
tell apart: a rank that always finishes a fixed time later on the same clock
looks like an offset clock; its ``residual`` is small either way, so the
offset is shown (``clocks()``, the report) with ``applied`` so the user can
judge.

``align_rows`` then gives each compared collective row its aligned arrivals
(``arrivals``, ``last_rank``, ``waits_us``, ``max_wait_us``,
``total_wait_us``: the figures stragglers and findings read) and keeps the
raw ones as ``*_raw`` (``arrivals_raw``, ``last_rank_raw``, ``waits_raw_us``,
``max_wait_raw_us``); ``aligned`` says whether any offset moved the row.
Durations are measured on one rank's clock and never change.
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchlens.analysis.runs.collectives import collective_tables, set_last
from torchlens.analysis.runs.rows import ClockRow, CollectiveRow
from torchlens.model.findings import INFO, Figure, Finding
from torchlens.model.run_figures import RankFigures, TraceFigures
from torchlens.model.units import format_duration

#: An offset is applied only above this (µs) ...
APPLY_MIN_US = 5.0
#: ... and above this many times the rank's median |residual|.
APPLY_FACTOR = 3.0


def _ends(ranks: RankFigures) -> dict[int, dict[tuple[int, int], float]]:
    """``{rank: {(trace, seq): end in unix seconds}}``."""
    return {rank: {(trace, c.seq): c.t1 for trace, recs in per.items() for c in recs}
            for rank, per in collective_tables(ranks).items()}


def clock_rows(ranks: RankFigures, rows: list[CollectiveRow]) -> list[ClockRow]:
    """One row per rank that has collectives (module docstring): ``rank``,
    ``reference`` (the reference rank), ``offset_us``, ``collectives``,
    ``residual_median_us``, ``residual_max_us``, ``applied``. Empty when fewer
    than two ranks have collectives. ``rows``: ``collective_rows``' result."""
    ends = _ends(ranks)
    if len(ends) < 2:
        return []
    ref = min(ends)
    hosts = {f.host if isinstance(f.host, str) else None
             for figures in ranks.values() for f in figures}
    one_host = len(hosts) == 1 and None not in hosts
    matched = [(r.trace, r.seq) for r in rows if r.arrivals is not None
               and len(r.arrivals) >= 2 and not r.mismatch]
    out = []
    for rank in sorted(ends):
        mine = ends[rank]
        # differences in µs, taken from the unix seconds (0.2 µs resolution at today's dates)
        d = np.array([(mine[k] - ends[ref][k]) * 1e6 for k in matched
                      if k in mine and k in ends[ref]])
        row = ClockRow(rank=rank, reference=ref, offset_us=None, collectives=len(d),
                       residual_median_us=None, residual_max_us=None, applied=False,
                       host=_host(ranks.get(rank, [])))
        if len(d):
            offset = 0.0 if rank == ref else float(np.median(d))
            resid = np.abs(d - offset)
            row.offset_us, row.residual_max_us = offset, float(resid.max())
            row.residual_median_us = median = float(np.median(resid))
            row.applied = bool(not one_host and abs(offset) > APPLY_MIN_US
                               and abs(offset) > APPLY_FACTOR * median)
        out.append(row)
    return out


def _host(figures: list[TraceFigures]) -> str | None:
    """The rank's host when its traces name one (``None`` otherwise)."""
    names = {f.host for f in figures if isinstance(f.host, str)}
    return ", ".join(sorted(names)) if names else None


def applied_offsets(clocks: list[ClockRow]) -> dict[int, float]:
    """``{rank: offset_us}`` of the offsets that are applied (others: 0)."""
    return {c.rank: c.offset_us for c in clocks if c.applied and c.offset_us is not None}


def alignment_words(clocks: list[ClockRow]) -> str:
    """What was done to the ranks' clocks, in the words the run timeline's axis
    and its caption both use (one phrase, so an axis never says "clocks
    aligned" under a caption saying no offset was applied).
    Ranks on one host keep their own clock (module docstring), so there the
    axis is each rank's recorded time, not an aligned one."""
    moved = applied_offsets(clocks)
    if moved:
        return (f"{len(moved)} rank's clock moved by its offset" if len(moved) == 1 else
                f"{len(moved)} ranks' clocks moved by their offsets")
    hosts = {c.host for c in clocks}
    if not clocks:
        why = "no two ranks share a collective to compare their clocks by"
    elif len(hosts) == 1 and None not in hosts:
        why = "one host, one clock"
    else:
        why = (f"no offset over {APPLY_MIN_US:g} µs and {APPLY_FACTOR:g}x its rank's "
               "residual")
    return f"no clock offset applied: {why}"


def align_rows(rows: list[CollectiveRow], clocks: list[ClockRow]) -> list[CollectiveRow]:
    """``rows`` with aligned arrivals and the raw ones as ``*_raw`` (module docstring)."""
    offsets = applied_offsets(clocks)
    out = []
    for row in rows:
        row = msgspec.structs.replace(
            row, arrivals_raw=row.arrivals, last_rank_raw=row.last_rank,
            waits_raw_us=row.waits_us, max_wait_raw_us=row.max_wait_us, aligned=False)
        arrivals = row.arrivals
        if arrivals and any(offsets.get(r) for r in arrivals):
            shifted = {r: t - offsets.get(r, 0.0) / 1e6 for r, t in arrivals.items()}
            row.arrivals, row.aligned = shifted, True
            if row.last_rank is not None:
                set_last(row, shifted)
        out.append(row)
    return out


class RunSkew(msgspec.Struct, frozen=True):
    """Over the run: the largest |offset|, the median and largest residual over
    the ranks (``None`` when no rank has an offset), and how many were applied."""

    max_offset_us: float | None = None
    residual_median_us: float | None = None
    residual_max_us: float | None = None
    applied: int = 0


def run_skew(clocks: list[ClockRow]) -> RunSkew:
    """The run's clock skew (``RunSkew``) from its ranks' clock rows."""
    have = [(c, c.offset_us, c.residual_median_us, c.residual_max_us) for c in clocks
            if c.offset_us is not None and c.rank != c.reference]
    if not have:
        return RunSkew()
    return RunSkew(max_offset_us=max(abs(o) for _, o, _, _ in have),
                   residual_median_us=float(np.median([m for _, _, m, _ in have])),
                   residual_max_us=max(x or 0.0 for _, _, _, x in have),
                   applied=sum(c.applied for c, _, _, _ in have))


def findings(clocks: list[ClockRow]) -> list[Finding]:
    """One sentence when offsets were applied: how many ranks, the largest, and
    the residual skew left after aligning."""
    moved = [c for c in clocks if c.applied]
    if not moved:
        return []
    worst = max(moved, key=lambda c: abs(c.offset_us or 0.0))
    offset = worst.offset_us or 0.0
    skew = run_skew(clocks)
    ahead = "ahead of" if offset > 0 else "behind"
    return [Finding(
        INFO, f"{len(moved)} rank(s) ran on clocks offset from rank {worst.reference}'s "
        f"(largest: rank {worst.rank}, {format_duration(abs(offset))} "
        f"{ahead}), found from the ends of {worst.collectives} shared collectives; "
        f"arrivals and waits are aligned (residual skew: median "
        f"{format_duration(skew.residual_median_us)}, "
        f"at most {format_duration(skew.residual_max_us)})",
        (Figure("ranks_offset", len(moved)), Figure("max_offset_us", abs(offset), "µs"),
         Figure("residual_median_us", skew.residual_median_us, "µs"),
         Figure("residual_max_us", skew.residual_max_us, "µs")), code="clock_offset")]
