"""The slow ranks of a multi-rank run: who made the others wait at its
collectives (``collectives.collective_rows``), and which ranks stand out.

Who waited for whom (``straggler_rows``; each rank a slow rank may be), over the compared rows with two ranks or
more: per rank, how often it arrived last (``last``, ``last_pct`` of the
collectives it took part in), the wait it caused (``caused_us``: the others'
waits summed over the collectives it arrived last at; ``caused_mean_us`` per
such collective) and the wait it suffered (``waited_us``), ranked by the
wait caused.

Findings (``findings``): a rank stands out at a kind of collective when

1. it arrived last at k of the m compared collectives of that kind it took
   part in, and either k that high is unlikely by chance: if each of the
   ``r`` ranks compared at a collective were equally likely to be last
   (p = mean of 1/r), the binomial chance of k or more is below
   ``STANDOUT_P`` (1%) divided by the number of ranks compared at that kind
   (Bonferroni: the 1% is the chance that any rank of an even run is named,
   which without the division grows with the world size; an even 4-rank run
   has one rank or another last at all 4 of its allreduces 1.6% of the
   time); or, for short traces where no count can be that unlikely, it was
   last at least ``FEW_LAST`` (3) times and at half or more of them, and the
   median wait it caused at those collectives is at least ``FEW_RATIO`` (5x)
   the median wait at the kind's other collectives (those where someone
   else was last; any wait when there are none) and at least the robust
   spread of its own waits (``chance.robust_spread``). Medians and the
   spread, not means: with means, one scheduler hiccup of 230 ms on an
   even 4-rank run named the rank last at it and at 3 other allreduces of 8;
   and
2. the others waited at least ``STANDOUT_WAIT_US`` (1 ms) in total for it there.

A rank that stands out while its profiled steps were broken down and no part
of them explains it (``causes`` has none for it, or its part's excess is under
``EXPLAINS``, half, of the wait per step, the step records' test) gets a note, not the slow
rank's sentence: its time went outside its measured work, which
on a machine with fewer free cores than ranks is the OS scheduler holding
it back (an even 2-rank CPU run on 2 busy cores had rank 1 last at all 8
allreduces, 9 ms each, with every part of its steps equal to rank 0's).

The sentence says how the arrivals were measured (``MEASURED``): on GPU
traces by the NCCL kernels' start, else by the host's issue.

Each such rank and kind gets the slow rank's one sentence
(``analysis.ranks.slow.slow_rank_finding``), with its likely cause when
``findings`` is given one (``causes.likely_cause``: the part of its step
breakdown that stands out) and the wait per profiled step when the steps are
known (largest wait first); mismatches get one finding naming the first and
how many.
"""

from __future__ import annotations

from statistics import median

import numpy as np

from torchlens.analysis.ranks.chance import binomial_tail, robust_spread
from torchlens.analysis.ranks.slow import EXPLAINS, PartTime, slow_rank_finding
from torchlens.analysis.runs.collectives import RankFigures, collective_rows
from torchlens.analysis.runs.rows import CollectiveRow, StragglerRow
from torchlens.model.findings import INFO, WARNING, Figure, Finding
from torchlens.model.units import format_duration, format_percent

#: A rank stands out when the chance of arriving last that often is below this.
STANDOUT_P = 0.01
#: ... and the others waited at least this long (µs, in total) for it.
STANDOUT_WAIT_US = 1000.0
#: Few collectives: last at least this often (and at half of them or more) ...
FEW_LAST = 3
#: ... and causing this many times the wait of the kind's other collectives.
FEW_RATIO = 5.0


def _compared(rows: list[CollectiveRow]) -> list[CollectiveRow]:
    return [r for r in rows if r.last_rank is not None]


def straggler_rows(ranks: RankFigures, world_size: int | None = None,
                   rows: list[CollectiveRow] | None = None) -> list[StragglerRow]:
    """Per rank (module docstring): ``rank``, ``collectives``, ``last``,
    ``last_pct``, ``caused_us`` (every other rank's wait for it, summed),
    ``caused_each_us`` / ``caused_mean_us`` (the wait of one other rank, on
    average over the ranks that waited: in all, and per collective it arrived
    last at, the figure the slow-rank sentence gives), ``waited_us``; ranked by
    ``caused_us`` (largest first), then rank. ``rows``: ``collective_rows``'
    result when already computed."""
    compared = _compared(rows if rows is not None else collective_rows(ranks, world_size))
    stats = {r: StragglerRow(r) for r in sorted(ranks)}
    each: dict[int, float] = {}
    for row in compared:
        waits = row.waits_us or {}
        for r, wait in waits.items():
            s = stats.setdefault(r, StragglerRow(r))
            s.collectives += 1
            s.waited_us += wait
        last = row.last_rank
        assert last is not None  # compared rows have one
        s = stats[last]
        s.last += 1
        s.caused_us += row.total_wait_us or 0.0
        # what one other rank waited, as the slow-rank sentence counts it
        each[last] = each.get(last, 0.0) + (row.total_wait_us or 0.0) / max(1, len(waits) - 1)
        s.caused_each_us = each[last]
    for s in stats.values():
        if s.collectives:
            s.last_pct = 100.0 * s.last / s.collectives
        if s.last:
            s.caused_mean_us = each.get(s.rank, 0.0) / s.last
    return sorted(stats.values(), key=lambda s: (-s.caused_us, s.rank))


def _stands_out(k: int, m: int, p: float, caused: float, kind_rows: list[CollectiveRow],
                rank: int, family: int) -> bool:
    if caused < STANDOUT_WAIT_US or k <= m * p:
        return False
    alpha = STANDOUT_P / max(1, family)
    if binomial_tail(k, m, p) < alpha:
        return True
    if k < FEW_LAST or 2 * k < m:
        return False
    own = [r.total_wait_us or 0.0 for r in kind_rows if r.last_rank == rank]
    rest = [r.total_wait_us or 0.0 for r in kind_rows if r.last_rank != rank]
    if median(own) < robust_spread(own):
        return False  # one hiccup, not a wait at every collective it was last at
    return not rest or median(own) >= FEW_RATIO * median(rest)


def findings(ranks: RankFigures, world_size: int | None = None,
             rows: list[CollectiveRow] | None = None,
             causes: dict[int, PartTime] | None = None,
             steps: dict[int, int] | None = None, name_ranks: bool = True) -> list[Finding]:
    """The ranks that stand out, each in the slow rank's one sentence
    (``analysis.ranks.slow.slow_rank_finding``), and the sequences that
    disagree (the rule: module docstring); empty when nothing does.

    ``causes``: rank -> the part of its step that makes it late;
    ``steps``: rank -> its number of profiled steps (for the wait per step);
    ``name_ranks``: False where another verdict names the slow rank (a run
    folder's step records): only the disagreeing sequences then."""
    rows = rows if rows is not None else collective_rows(ranks, world_size)
    causes = causes or {}
    steps = steps or {}
    found: list[tuple[float, Finding]] = []
    by_kind: dict[str, list[CollectiveRow]] = {}
    for row in _compared(rows):
        by_kind.setdefault(str(row.name), []).append(row)
    for kind, kind_rows in (by_kind if name_ranks else {}).items():
        p = float(np.mean([1.0 / len(r.waits_us or {}) for r in kind_rows]))
        took_part: dict[int, int] = {}
        last: dict[int, int] = {}
        caused: dict[int, float] = {}
        each: dict[int, float] = {}
        for row in kind_rows:
            waits = row.waits_us or {}
            for r in waits:
                took_part[r] = took_part.get(r, 0) + 1
            r = row.last_rank or 0
            total = row.total_wait_us or 0.0
            last[r] = last.get(r, 0) + 1
            caused[r] = caused.get(r, 0.0) + total
            # the wait of one other rank, on average over the ranks that waited
            each[r] = each.get(r, 0.0) + total / max(1, len(waits) - 1)
        for r, k in last.items():
            m = took_part[r]
            if not _stands_out(k, m, p, caused[r], kind_rows, r, len(took_part)):
                continue
            per_step = each[r] / steps[r] if steps.get(r) else None
            part = causes.get(r)
            if per_step is not None and (part is None
                                         or part.excess_ms < EXPLAINS * per_step / 1e3):
                found.append((0.0, _unexplained(r, kind, k, m, per_step)))
                continue
            found.append((caused[r], _slow_rank(r, kind, k, m, caused[r], causes.get(r),
                                                per_step, _measured(kind_rows))))
    out = [f for _, f in sorted(found, key=lambda f: -f[0])]
    bad = [r for r in rows if r.mismatch]
    if bad:
        first = bad[0]
        where = f"seq {first.seq}" + (f" of trace {first.trace}"
                                      if len({r.trace for r in rows}) > 1 else "")
        out.append(Finding(
            WARNING, f"the ranks' collective sequences disagree at {len(bad)} of {len(rows)} "
            f"collectives, first at {where} ({first.mismatch}); those are not paired "
            "(a collective skipped or issued in another order, another process group, "
            "or trace windows that start at different points)",
            (Figure("mismatched", len(bad)), Figure("collectives", len(rows))),
            code="collective_mismatch"))
    return out


#: How an arrival was measured (``collectives``' ``arrived_by``), in the sentence.
MEASURED = {"kernel": "arrival = its NCCL kernel's start on the GPU",
            "host": "arrival = when its host issued the call"}


def _measured(rows: list[CollectiveRow]) -> str:
    """How the arrivals of ``rows`` were measured, in words ('' when not said)."""
    ways = {r.arrived_by for r in rows} - {None}
    if len(ways) == 1:
        return MEASURED.get(ways.pop(), "")
    if ways:
        return "arrival = its NCCL kernel's start on the GPU where traced, else its host's issue"
    return ""


def _unexplained(rank: int, kind: str, k: int, m: int, per_step_us: float) -> Finding:
    """The note for a rank that stands out with no part of its steps explaining it."""
    return Finding(
        INFO, f"rank {rank} arrived last at {k} of {m} {kind}s (each other rank waited "
        f"{format_duration(per_step_us)} per step), but no part of its profiled steps explains "
        "that wait: the time went outside its measured work (with fewer free cores than "
        "ranks, the OS scheduler holding it back); not a slow-rank verdict",
        (Figure("late_rank", rank), Figure("last", k), Figure("compared", m),
         Figure("wait_per_step_us", per_step_us, "µs")), code="late_rank")


def _slow_rank(rank: int, kind: str, k: int, m: int, caused_us: float, cause: PartTime | None,
               per_step_us: float | None, measured: str = "") -> Finding:
    """A rank that stands out at ``kind``, in the slow rank's sentence."""
    per_step = (f", each other rank {format_duration(per_step_us)} per step"
                if per_step_us else "")
    how = f"; {measured}" if measured else ""
    waited = (f"it arrived last at {format_percent(100.0 * k / m)} of {kind}s ({k} of {m}{how}), "
              f"the others waited {format_duration(caused_us)} in total for it "
              f"({format_duration(caused_us / k)} per {kind}{per_step})")
    figures = (Figure("last", k), Figure("compared", m), Figure("total_wait_us", caused_us, "µs"),
               Figure(f"wait_per_{kind}_us", caused_us / k, "µs"),
               *((Figure("wait_per_step_us", per_step_us, "µs"),) if per_step_us else ()))
    return slow_rank_finding(rank, cause, waited, figures)
