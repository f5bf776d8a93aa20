"""Per-rank steps of ``%ddp_check --profile``: which rank is slow and why, and
whose memory creeps.

Pure functions over the step records and profiled-step summaries of
docs/RANK_PROFILE.md (``steps[r]``, ``summaries[r]``: one list per rank). They
run on the growing window of a live run (twice a second, up to 8 ranks x a few
hundred steps: tens of milliseconds at most) and on the finished run.

Definitions (times in ms; a phase that is null or missing counts as 0, since
its timer never ran):

- ``other`` = step time - the sum of the phases, at least 0 (clock rounding).
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

Memory: per rank and step, the step record's ``mem`` (``cuda`` or ``rss``);
a CPU step takes allocated, reserved, inactive_split and largest_free from the
profiled-step summary of the same step (``modelled``). ``frag`` =
inactive_split / reserved. Creep: per rank with at least ``min_steps`` steps,
after the first 20% of its steps (warm-up), the least-squares slope of
allocated bytes over the step index (of RSS when fewer than 3 of those steps
have measured allocated bytes: a modelled figure replays one profiled step from
an empty allocator, so it cannot show growth between steps, and CPU creep is
judged on RSS). A rank creeps when the slope is positive, the growth
over the fitted steps (slope x their span) is at least 1 MiB (8 MiB for RSS,
which moves with the C allocator too), the line explains at least 70% of the
variance (R^2 >= 0.7: a leak is steady, warm-up stairs are not) and the slope is
at least twice the median slope of the other ranks (always, when their median
is 0 or less or there are no others).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from statistics import median
from typing import Any

from torchlens.model.records import StepMemory, StepRecord, StepSummary
from torchlens.model.units import format_bytes

PHASES = ("data", "forward", "backward", "optimizer", "collective")
CAUSE_WORDS = {"data": "waiting for data", "compute": "computing",
               "collective": "waiting in a collective"}
MEMORY_KEYS = ("allocated", "reserved", "inactive_split", "largest_free")

MIN_LATE_SHARE = 0.5
MIN_GAP_SHARE = 0.05  # of the median step
MIN_GAP_MS = 0.5
TIE_MS = 1e-3  # below the clocks' resolution: nobody arrived last
EXPLAINS = 0.5  # share of the gap a part's excess must reach to be the cause
WARMUP = 0.2
MIN_CREEP_BYTES = 1 << 20
#: RSS moves with the C allocator's arenas and page reuse, not only with
#: tensors: its growth must be larger before it counts
MIN_RSS_CREEP_BYTES = 8 << 20
#: a creep is steady: the straight line explains most of the variation
#: (warm-up stairs and allocator noise do not)
MIN_CREEP_R2 = 0.7
CREEP_VS_OTHERS = 2.0
MIN_FIT_POINTS = 3

Steps = list[list[StepRecord]]
Summaries = list[list[StepSummary]]
_NO_MEMORY = StepMemory()
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


@dataclass
class MemoryCreep:
    """A rank whose memory grows step after step past its warm-up."""

    rank: int
    bytes_per_step: float
    total_bytes: int
    steps: int
    source: str
    words: str


def _record_ms(rec: StepRecord) -> tuple[float, list[float | None], float]:
    """(step, the phases in ``PHASES`` order with None unmeasured, other), in ms."""
    phases = rec.phases
    values: list[float | None] = []
    measured = 0.0
    for p in PHASES:  # a plain loop: 3x faster than comprehensions, and this runs live
        v = phases.get(p)
        if v is not None:
            v *= 1e3
            measured += v
        values.append(v)
    step = 1e3 * (rec.t1 - rec.t0)
    return step, values, step - measured if step > measured else 0.0


def _times(rec: StepRecord) -> dict[str, float]:
    """Step, phases (unmeasured as 0) and other, in ms."""
    step, values, other = _record_ms(rec)
    out = {p: v or 0.0 for p, v in zip(PHASES, values, strict=True)}
    out["step"], out["other"] = step, other
    return out


_PHASE_KEYS = tuple(f"{p}_ms" for p in PHASES)


def step_rows(steps: Steps) -> list[dict[str, Any]]:
    """One row per rank and step; an unmeasured phase stays None."""
    rows = []
    for r, recs in enumerate(steps):
        for rec in recs or []:
            step, values, other = _record_ms(rec)
            row = {"rank": r, "step": rec.step, "t0": rec.t0, "t1": rec.t1,
                   "step_ms": step, "other_ms": other, "profiled": rec.profiled,
                   "window": rec.window}
            row.update(zip(_PHASE_KEYS, values, strict=True))
            rows.append(row)
    return rows


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
    by_rank = {r: {rec.step: rec for rec in recs} for r, recs in enumerate(steps) if recs}
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


_Memory = tuple[Any, Any, Any, Any, Any, Any, Any, str]  # step, t1, MEMORY_KEYS..., rss, source


def _memory(recs: list[StepRecord], summaries: list[StepSummary]) -> list[_Memory]:
    """One rank's memory per step, with its profiled steps' figures where the
    step record has none (a CPU step's modelled allocator)."""
    profiled = {s.get("step"): s.get("memory") or {} for s in summaries}
    out = []
    for rec in recs:
        mem = rec.mem or _NO_MEMORY
        extra = profiled.get(rec.step) or {}
        own = (mem.allocated, mem.reserved, mem.inactive_split, mem.largest_free)
        values = [v if v is not None else extra.get(k)
                  for k, v in zip(MEMORY_KEYS, own, strict=True)]
        if mem.allocated is not None:
            source = mem.source or "cuda"
        elif extra.get("allocated") is not None:
            source = extra.get("source") or "modelled"
        else:
            source = mem.source or "rss"
        out.append((rec.step, rec.t1, *values, mem.rss, source))
    # a summary whose step record is not here (yet): the live view gets a
    # profiled step's summary apart from its step's record
    recorded = {rec.step for rec in recs}
    for s in summaries:
        extra = s.get("memory") or {}
        if s.get("step") not in recorded and extra.get("allocated") is not None:
            out.append((s.get("step"), s.get("t1"), *(extra.get(k) for k in MEMORY_KEYS),
                        None, extra.get("source") or "modelled"))
    return out


def per_rank_memory(steps: Steps, summaries: Summaries) -> list[list[_Memory]]:
    """Each rank's memory per step (``memory_creep`` and ``rank_table`` can share one:
    at 1,024 ranks it is most of the live summary's cost)."""
    n = max(len(steps), len(summaries))
    return [_memory((steps[r] if r < len(steps) else None) or [],
                    (summaries[r] if r < len(summaries) else None) or [])
            for r in range(n)]


def _frag(inactive: Any, reserved: Any) -> float | None:
    return inactive / reserved if inactive is not None and reserved else None


def memory_rows(steps: Steps, summaries: Summaries) -> list[dict[str, Any]]:
    """One row per rank and step: the allocator figures, fragmentation, RSS and
    where they came from (``cuda``, ``modelled`` or ``rss``)."""
    return [{"rank": r, "step": step, "t1": t1, "allocated": alloc, "reserved": reserved,
             "inactive_split": inactive, "largest_free": largest,
             "frag": _frag(inactive, reserved), "rss": rss, "source": source}
            for r, rank in enumerate(per_rank_memory(steps, summaries))
            for step, t1, alloc, reserved, inactive, largest, rss, source in rank]


def _slope(points: list[tuple[float, float]]) -> float:
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def _fit(memory: list[_Memory]) -> tuple[float, list[tuple[float, float]], str] | None:
    """(slope, points, source) of one rank after its warm-up."""
    rows = sorted((m for m in memory if m[0] is not None), key=lambda m: m[0])
    rows = rows[int(len(rows) * WARMUP):]
    # modelled figures come from one profiled step replayed from an empty
    # allocator: they cannot show growth from one step to the next
    counted = [m for m in rows if m[2] is not None and m[7] != "modelled"]
    points = [(float(m[0]), float(m[2])) for m in counted]
    source = next((m[7] for m in counted), "rss")
    if len(points) < MIN_FIT_POINTS:
        points = [(float(m[0]), float(m[6])) for m in rows if m[6] is not None]
        source = "rss"
    if len(points) < MIN_FIT_POINTS:
        return None
    return _slope(points), points, source


def _r2(points: list[tuple[float, float]], slope: float) -> float:
    """Share of the variance of ``points`` the least-squares line explains."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    total = sum((y - my) ** 2 for _, y in points)
    if not total:
        return 0.0
    residual = sum((y - (my + slope * (x - mx))) ** 2 for x, y in points)
    return 1.0 - residual / total


def memory_creep(steps: Steps, summaries: Summaries, min_steps: int = 8,
                 memory: list[list[_Memory]] | None = None) -> list[MemoryCreep]:
    """The ranks whose memory creeps (definition: the module docstring).
    ``memory``: ``per_rank_memory(steps, summaries)`` when the caller has it."""
    if memory is None:
        memory = per_rank_memory(steps, summaries)
    fits = {r: f for r, memory in enumerate(memory)
            if len(memory) >= min_steps and (f := _fit(memory)) is not None}
    out = []
    for r, (slope, points, source) in sorted(fits.items()):
        others = [f[0] for q, f in fits.items() if q != r]
        total = slope * (points[-1][0] - points[0][0])
        floor = MIN_RSS_CREEP_BYTES if source == "rss" else MIN_CREEP_BYTES
        if slope <= 0 or total < floor or _r2(points, slope) < MIN_CREEP_R2:
            continue
        if others and median(others) > 0 and slope < CREEP_VS_OTHERS * median(others):
            continue
        span = int(points[-1][0] - points[0][0]) + 1
        label = {"rss": "RSS", "cuda": "allocated"}.get(source, f"allocated, {source}")
        out.append(MemoryCreep(r, slope, round(total), span, source,
                               f"rank {r}: memory creep, +{format_bytes(slope)} per step over "
                               f"{span} steps ({label})"))
    return out


def _median(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return median(present) if present else None


def _peak(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


#: the %%torchprof step breakdown's roles (analysis.steps, the TensorBoard
#: plugin's definitions), as a profiled-step summary carries them
ROLES = ("kernel", "memcpy", "memset", "comm", "runtime", "dataloader", "cpu_exec", "other")


def profiled_breakdown(summaries: Summaries) -> list[dict[str, Any]]:
    """One row per rank: the median over its profiled steps of the ``%%torchprof``
    step breakdown (``<role>_ms`` for each of ``ROLES``, and ``step_ms``), and how
    many profiled steps it rests on. Ranks without a summary yet have None."""
    out = []
    for r, sums in enumerate(summaries):
        sums = [s for s in sums or [] if isinstance(s.get("breakdown"), dict)]
        row: dict[str, Any] = {"rank": r, "profiled": len(sums),
                               "step_ms": _median([s.get("step_ms") for s in sums])}
        for role in ROLES:
            us = _median([s["breakdown"].get(f"{role}_us") for s in sums])
            row[f"{role}_ms"] = None if us is None else us / 1000
        out.append(row)
    return out


def rank_table(steps: Steps, summaries: Summaries,
               per_rank: list[list[_Memory]] | None = None) -> list[dict[str, Any]]:
    """One row per rank: median step and phase times over all its steps, the
    latest and peak allocator figures, fragmentation and RSS. ``per_rank``:
    ``per_rank_memory(steps, summaries)`` when the caller has it."""
    out = []
    for r, memory in enumerate(per_rank if per_rank is not None
                               else per_rank_memory(steps, summaries)):
        timed = [_record_ms(rec) for rec in steps[r] or []]
        row: dict[str, Any] = {"rank": r, "steps": len(timed),
                               "step_ms": _median([t[0] for t in timed]),
                               "other_ms": _median([t[2] for t in timed])}
        for i, key in enumerate(_PHASE_KEYS):
            row[key] = _median([t[1][i] for t in timed])
        memory = sorted(memory, key=lambda m: -1 if m[0] is None else m[0])
        column = list(zip(*memory, strict=True)) if memory else [()] * 8
        latest = next((m for m in reversed(memory) if m[2] is not None), None)
        _, _, alloc, reserved, inactive, largest, _, source = latest or (None,) * 8
        summary_peaks = [(s.get("memory") or {}).get("peak_allocated")
                         for s in (summaries[r] if r < len(summaries) else None) or []]
        rss = next((m[6] for m in reversed(memory) if m[6] is not None), None)
        row.update(
            allocated=alloc, reserved=reserved, frag=_frag(inactive, reserved),
            largest_free=largest, peak_allocated=_peak([*column[2], *summary_peaks]),
            peak_reserved=_peak(list(column[3])), rss=rss, peak_rss=_peak(list(column[6])),
            source=source or ("rss" if rss is not None else None))
        out.append(row)
    return out
