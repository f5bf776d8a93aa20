"""The slow rank of ``%ddp_check --profile``, ``torchlens run`` and the watch:
which rank the others wait for, and why.

Pure functions over the step records of docs/RANK_PROFILE.md (``steps[r]``: one
list per rank), on the growing window of a live run (twice a second) and on the
finished run.

Definitions (times in ms; a phase that is null or missing counts as 0, since
its timer never ran; ``other`` as ``analysis.ranks.steps`` defines it):

- ``compute`` = forward + optimizer + other: the rank's own work outside data
  loading and synchronisation.
- ``sync`` = backward + collective: where a rank waits for the others. DDP
  waits for its gradient all_reduces inside ``backward`` (in C++), explicit
  collectives wait inside ``collective``. Both are sync because the rank that
  arrives last at either is the one the others wait for; leaving out
  ``collective`` would miss a slow rank whose peers wait in a logging
  all_reduce after the optimizer, or in one before backward. With no backward
  at all (explicit all_reduce loops), sync is the collectives alone.
- Steps compared: the steps every rank has (a rank that died or lags adds only
  the steps it finished; a rank with no record yet is left out), the last
  ``window`` of them. Steps pair by their index, also fixed windows
  (``window: true``), which then pair only roughly.
- Per step: the *late* rank is the one with the least sync; the others waited
  ``median(sync of the others) - its sync`` for it. A step in which that is
  under 1 us (the clocks' resolution: equal ranks) has no late rank.
- The rank late in the most steps (ties: the lowest rank) is the candidate:
  ``late_share`` = its share of the steps, ``gap_ms`` = the median over the
  steps of how long the others waited for it (every step of the window, not
  only those it was last in).
- It is the slow rank when ``late_share`` >= 50%, ``gap_ms`` >= 5% of the
  median step and ``gap_ms`` >= 0.5 ms.
- Cause: per step, the candidate's part minus the median of the others' part,
  median over the steps (its *excess*); the part (``data`` or ``compute``)
  whose excess is at least half of ``gap_ms`` is the cause, the larger if
  both. When step times are equal the two excesses add up to the gap, so one
  of them explains it; when neither does, cause is None and the words say so.
- Cause ``collective``: with ``collective`` in sync, a rank held up by its own
  collectives (a gather to itself, a subgroup collective, a p2p receive) has
  as much sync as the others and is not found. So when no rank is found and
  the ranks do run backward, the rule is applied again with sync = backward
  alone, and its answer is kept only when the candidate's excess of
  ``collective`` explains half the gap. Without backward the late rank has
  the least collective time by definition: collective is never its cause.
- ``median_step_ms``: the median over ranks of each rank's median step time in
  the window; ``skew_pct`` = (the largest of those - that median) / that
  median x 100. When no rank is slow, ``rank`` and ``cause`` are None and
  ``gap_ms``/``late_share`` are those of the rank late most often.

Known blind spots: a rank whose backward itself computes slowly keeps the
others waiting inside the same ``backward`` timer; all ranks then leave
backward together and no rank stands out here (its profiled steps show it).
The timers see a wait only where the host blocks: always with gloo; with NCCL
only where the rank side synchronises the device at the end of a phase, else
the wait shows up in whichever phase next blocks on the GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median
from typing import Any

from torchlens.analysis.ranks.steps import PHASES, Steps, _record_ms

CAUSE_WORDS = {"data": "waiting for data", "compute": "computing",
               "collective": "waiting in a collective"}

MIN_LATE_SHARE = 0.5
MIN_GAP_SHARE = 0.05  # of the median step
MIN_GAP_MS = 0.5
TIE_MS = 1e-3  # below the clocks' resolution: nobody arrived last
EXPLAINS = 0.5  # share of the gap a part's excess must reach to be the cause

_PARTS: dict[str, Callable[[dict[str, float]], float]] = {
    "data": lambda x: x["data"],
    "compute": lambda x: x["forward"] + x["optimizer"] + x["other"],
    "collective": lambda x: x["collective"],
}
_PART_WORDS = {"data": "data loading", "compute": "forward, optimizer and other work",
               "collective": "own collectives"}


@dataclass
class SlowRank:
    """The verdict on one window of steps (definitions: the module docstring)."""

    rank: int | None
    cause: str | None
    words: str
    gap_ms: float
    late_share: float
    skew_pct: float
    median_step_ms: float
    steps: int


def _times(rec: dict[str, Any]) -> dict[str, float]:
    """Step, phases (unmeasured as 0) and other, in ms."""
    step, values, other = _record_ms(rec)
    out = {p: v or 0.0 for p, v in zip(PHASES, values, strict=True)}
    out["step"], out["other"] = step, other
    return out


def _late(times: dict[int, list[dict[str, float]]], sync: tuple[str, ...]) -> tuple[int, float, float]:
    """(rank late most often, its share of the steps, median wait of the others for it)."""
    ranks = sorted(times)
    n = len(times[ranks[0]])
    waits = {r: [sum(x[p] for p in sync) for x in times[r]] for r in ranks}
    late: Counter[int] = Counter()
    for i in range(n):
        first = min(ranks, key=lambda r: waits[r][i])
        if median(waits[q][i] for q in ranks if q != first) - waits[first][i] > TIE_MS:
            late[first] += 1
    rank = min(ranks, key=lambda r: (-late[r], r))
    gaps = [median(waits[q][i] for q in ranks if q != rank) - waits[rank][i] for i in range(n)]
    return rank, late[rank] / n, median(gaps)


def _excess(times: dict[int, list[dict[str, float]]], rank: int, part: str) -> float:
    get = _PARTS[part]
    others = [q for q in times if q != rank]
    return median(get(times[rank][i]) - median(get(times[q][i]) for q in others)
                  for i in range(len(times[rank])))


def _cause(times: dict[int, list[dict[str, float]]], rank: int, gap: float,
           parts: tuple[str, ...]) -> tuple[str | None, dict[str, float]]:
    excess = {p: _excess(times, rank, p) for p in parts}
    best = max(parts, key=lambda p: excess[p])
    return (best if excess[best] >= EXPLAINS * gap else None), excess


def _part_words(times: dict[int, list[dict[str, float]]], rank: int, part: str) -> str:
    get = _PARTS[part]
    own = median(get(x) for x in times[rank])
    others = median(median(get(times[q][i]) for q in times if q != rank)
                    for i in range(len(times[rank])))
    what = f"its {_PART_WORDS[part]} took"
    if others >= 0.05 and own / others >= 1.05:
        return f"{what} {own / others:.1f}x the median, {own:.1f} ms against {others:.1f} ms"
    return f"{what} {own:.1f} ms per step, the others' median {others:.1f} ms"


def _nobody(words: str, steps: int = 0, **figures: float) -> SlowRank:
    return SlowRank(None, None, f"no slow rank: {words}", figures.get("gap_ms", 0.0),
                    figures.get("late_share", 0.0), figures.get("skew_pct", 0.0),
                    figures.get("median_step_ms", 0.0), steps)


def slow_rank(steps: Steps, window: int | None = 20) -> SlowRank:
    """The rank the others wait for in the last ``window`` common steps (all
    of them when ``window`` is None), and why."""
    by_rank = {r: {rec.get("step", i): rec for i, rec in enumerate(recs)}
               for r, recs in enumerate(steps) if recs}
    if len(steps) < 2:
        return _nobody("one rank, nothing to compare")
    if len(by_rank) < 2:
        return _nobody("only one rank has reported steps" if by_rank
                       else "no rank has reported a step")
    common = sorted(set.intersection(*(set(d) for d in by_rank.values())))
    common = common[-window:] if window else common
    if not common:
        return _nobody("no step has ended on every rank yet")
    times = {r: [_times(d[s]) for s in common] for r, d in by_rank.items()}
    per_rank = [median(x["step"] for x in t) for t in times.values()]
    mid = median(per_rank)
    figures = {"median_step_ms": mid,
               "skew_pct": (max(per_rank) - mid) / mid * 100 if mid > 0 else 0.0}
    n = len(common)

    def stands_out(share: float, gap: float) -> bool:
        return share >= MIN_LATE_SHARE and gap >= max(MIN_GAP_SHARE * mid, MIN_GAP_MS)

    rank, share, gap = _late(times, ("backward", "collective"))
    cause, excess = _cause(times, rank, gap, ("data", "compute"))
    found = stands_out(share, gap)
    if not found and any(x["backward"] > 0 for t in times.values() for x in t):
        r2, s2, g2 = _late(times, ("backward",))
        c2, _ = _cause(times, r2, g2, ("data", "compute", "collective"))
        if stands_out(s2, g2) and c2 == "collective":
            found, rank, share, gap, cause = True, r2, s2, g2, c2
    if not found:
        words = f"step times within {max(1, round(figures['skew_pct']))}% (median {mid:.1f} ms)"
        if share < MIN_LATE_SHARE and gap >= max(MIN_GAP_SHARE * mid, MIN_GAP_MS):
            words += "; the rank the others wait for changes from step to step"
        return _nobody(words, n, gap_ms=gap, late_share=share, **figures)
    waited = (f"arrived last in {round(share * n)} of {n} steps; "
              f"others waited {gap:.1f} ms per step for it")
    if cause is None:
        parts = ", ".join(f"{p} {excess[p]:+.1f} ms" for p in ("data", "compute"))
        words = (f"rank {rank} is the slow rank ({waited}); no measured part explains it "
                 f"({parts} per step against the others' median)")
    else:
        words = (f"rank {rank} is the slow rank: {CAUSE_WORDS[cause]} ({waited}; "
                 f"{_part_words(times, rank, cause)})")
    return SlowRank(rank, cause, words, gap, share, figures["skew_pct"], mid, n)
