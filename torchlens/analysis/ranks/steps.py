"""Per-rank steps of ``%ddp_check --profile``: step and memory rows, whose
memory creeps, and the rank table (the slow rank: ``analysis.ranks.slow``).

Pure functions over the step records and profiled-step summaries of
docs/RANK_PROFILE.md (``steps[r]``, ``summaries[r]``: one list per rank). They
run on the growing window of a live run (twice a second, up to 8 ranks x a few
hundred steps: tens of milliseconds at most) and on the finished run.

Definitions (times in ms; a phase that is null or missing counts as 0, since
its timer never ran):

- ``other`` = step time - the sum of the phases, at least 0 (clock rounding).
- ``save`` and ``eval``: a checkpoint save and an evaluation inside the step
  (``capture.ranks.phases``); records written before these phases existed
  lack them, which reads as 0 (their time is then in ``other``).

Memory: per rank and step, the step record's ``mem`` (``cuda`` or ``rss``);
a CPU step takes allocated, reserved, inactive_split and largest_free from the
profiled-step summary of the same step (``modelled``). ``frag`` =
inactive_split / reserved. Creep: per rank with at least ``min_steps`` steps,
after the first 20% of its steps (warm-up) and before its newest step, the least-squares slope over the
step index of the first of these with at least 3 such steps: measured
allocated bytes (CUDA); the C heap's bytes in use (``StepMemory.heap``, a CPU
rank on glibc: a modelled figure replays one profiled step from an empty
allocator, so it cannot show growth between steps); RSS. RSS rises on every
rank alike as the C allocator keeps pages, so a rank keeping 1 MiB more per
step hides in it; the heap figure falls when memory is freed.

The newest step is left out: a rank's last step closes as the job ends, so
its memory is read after the training loop has let go of what it kept (a
leak of 1 MiB a step read as a drop of 100 MiB at the last step, enough to
hide the leak from the fit over the collector's newest 64 steps).

Each rank is judged on its own growth, so a leak on every rank (each keeps its
loss every step) names every rank. A rank creeps when, over its steps after
warm-up:

- the slope is positive and the growth over the fitted steps (slope x their
  span) is at least 1 MiB (4 MiB for the heap, where Python's own objects come
  and go; 8 MiB for RSS, which moves with the C allocator too);
- the line explains at least 70% of the variance (R^2 >= 0.7: a leak is
  steady, warm-up stairs are not);
- both halves of those steps grow, each at least a quarter of the whole
  slope: memory that steps up once (state made at one step and kept) and then
  stays flat is no creep, even where one straight line fits the step well;
- the growth is the job's: the same tests hold with each change into a
  profiled step or into the step after it (torch.profiler's own buffers,
  the trace's export and summary) that stands out from the other steps'
  median change by more than 256 KiB taken as that median, so a profiler
  keeping a few MiB each time it runs (about 2.9 MiB a profiled step on an
  FSDP1 job's C heap) is no creep; a leak, which grows every step, passes
  both, and its figures are the measured ones;
- on RSS only (no allocator or heap figure), the slope is at least twice the
  median RSS slope of the other ranks (always, when their median is 0 or less
  or there are no others): RSS grows alike on every rank as the C allocator
  keeps pages. The allocated and heap figures are never compared across
  ranks, so a rank whose own growth is steady and large is always named.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Any

import msgspec

from torchlens.model.records import GpuStepTimes, StepMemory, StepRecord, StepSummary
from torchlens.model.units import format_bytes

PHASES = ("data", "forward", "backward", "optimizer", "collective", "save", "eval")
MEMORY_KEYS = ("allocated", "reserved", "inactive_split", "largest_free")

WARMUP = 0.2
MIN_CREEP_BYTES = 1 << 20
#: RSS moves with the C allocator's arenas and page reuse, not only with
#: tensors: its growth must be larger before it counts
MIN_RSS_CREEP_BYTES = 8 << 20
#: the C heap holds the interpreter's objects as well as tensors' storage
MIN_HEAP_CREEP_BYTES = 4 << 20
#: a creep is steady: the straight line explains most of the variation
#: (warm-up stairs and allocator noise do not)
MIN_CREEP_R2 = 0.7
#: RSS only: a rank's slope against the median of the other ranks' RSS slopes
CREEP_VS_OTHERS = 2.0
#: each half of the fitted steps grows at least this share of the whole slope
MIN_HALF_SHARE = 0.25
MIN_FIT_POINTS = 3

Steps = list[list[StepRecord]]
Summaries = list[list[StepSummary]]
_NO_MEMORY = StepMemory()


@dataclass
class MemoryCreep:
    """A rank whose memory grows step after step past its warm-up."""

    rank: int
    bytes_per_step: float
    total_bytes: int
    steps: int
    source: str
    words: str
    #: the first and last step fitted (the window compared: the last ones measured,
    #: not the leak's whole length); None in a record from an older torchlens
    first_step: int | None = None
    last_step: int | None = None


def record_ms(rec: StepRecord) -> tuple[float, list[float | None], float]:
    """(step, the phases in ``PHASES`` order with None unmeasured, other), in ms."""
    return phases_ms(rec.phases, rec.t1 - rec.t0)


def gpu_ms(times: GpuStepTimes) -> tuple[float, list[float | None], float]:
    """``record_ms`` of a step's GPU times (``StepRecord.gpu``)."""
    return phases_ms(times.phases, times.step_s)


def gpu_steps(recs: list[StepRecord]) -> dict[tuple[int, int], GpuStepTimes]:
    """A rank's GPU times by (start, step): each came with a later record of its start."""
    return {(rec.start, g.step): g for rec in recs if rec.gpu for g in rec.gpu}


def timed_ms(recs: list[StepRecord]) -> list[tuple[float, list[float | None], float]]:
    """``record_ms`` of each step as the slow-rank verdict times it: a rank timed
    on its GPU (its records carry CUDA-event times) by those, for the steps whose
    GPU times have come (a step or more later); any other by its host timers."""
    on_gpu = gpu_steps(recs)
    if not on_gpu:
        return [record_ms(rec) for rec in recs]
    return [gpu_ms(g) for rec in recs if (g := on_gpu.get((rec.start, rec.step))) is not None]


def phases_ms(phases: dict[str, float | None], step_s: float
              ) -> tuple[float, list[float | None], float]:
    """(step, the phases in ``PHASES`` order with None unmeasured, other), in ms."""
    values: list[float | None] = []
    measured = 0.0
    for p in PHASES:  # a plain loop: 3x faster than comprehensions, and this runs live
        v = phases.get(p)
        if v is not None:
            v *= 1e3
            measured += v
        values.append(v)
    step = 1e3 * step_s
    return step, values, step - measured if step > measured else 0.0


_PHASE_KEYS = tuple(f"{p}_ms" for p in PHASES)


def step_rows(steps: Steps) -> list[dict[str, Any]]:
    """One row per rank and step; an unmeasured phase stays None."""
    rows = []
    for r, recs in enumerate(steps):
        for rec in recs or []:
            step, values, other = record_ms(rec)
            row = {"rank": r, "step": rec.step, "t0": rec.t0, "t1": rec.t1,
                   "step_ms": step, "other_ms": other, "profiled": rec.profiled,
                   "window": rec.window}
            row.update(zip(_PHASE_KEYS, values, strict=True))
            rows.append(row)
    return rows


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
    """(slope, points, source) of one rank after its warm-up, its newest step left out."""
    rows = sorted((m for m in memory if m[0] is not None), key=lambda m: m[0])[:-1]
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


def _grows_in_both_halves(points: list[tuple[float, float]], slope: float) -> bool:
    """Whether the first and the second half of ``points`` each grow by at least
    ``MIN_HALF_SHARE`` of ``slope`` (a step up once, then flat, grows in one half)."""
    half = len(points) // 2
    halves = (points[:half + 1], points[half:])  # they share the middle step
    return all(len(h) >= 2 and _slope(h) >= MIN_HALF_SHARE * slope for h in halves)


def _heap_points(recs: list[StepRecord]) -> list[tuple[float, float]]:
    """(step, C heap bytes in use) of one rank after its warm-up, its newest step left out."""
    rows = sorted(((rec.step, heap) for rec in recs
                   if rec.mem is not None and isinstance(heap := rec.mem.heap, int)),
                  key=lambda row: row[0])[:-1]
    return [(float(step), float(heap)) for step, heap in rows[int(len(rows) * WARMUP):]]


def _rss_change(memory: list[_Memory], first: float, last: float) -> float | None:
    """RSS at step ``last`` less RSS at step ``first`` (context for a heap creep)."""
    at = {m[0]: m[6] for m in memory if m[0] is not None and m[6] is not None}
    return at[last] - at[first] if first in at and last in at else None


def _steady(points: list[tuple[float, float]], slope: float, floor: float) -> bool:
    """Growth of at least ``floor`` over ``points``, on a straight line, in both
    halves (the module docstring's first three tests)."""
    total = slope * (points[-1][0] - points[0][0])
    return (slope > 0 and total >= floor and _r2(points, slope) >= MIN_CREEP_R2
            and _grows_in_both_halves(points, slope))


def _profiled_steps(recs: list[StepRecord], summaries: list[StepSummary]) -> set[float]:
    """The steps one rank profiled (its records' flag, and the live summaries'
    steps whose record has not come)."""
    steps = {float(rec.step) for rec in recs if rec.profiled}
    return steps | {float(s["step"]) for s in summaries if isinstance(s.get("step"), int)}


#: a change into a profiled step (or the step after) above the others' median
#: change per step by more than this is the profiler's own memory
PROFILER_STAIR = 256 << 10


def _without_profiler(points: list[tuple[float, float]], profiled: set[float]
                      ) -> list[tuple[float, float]]:
    """``points`` with each change into a profiled step, or into the step after it,
    that stands out (above the median change per step of the other steps by more
    than ``PROFILER_STAIR``) replaced by that median: the job's own growth. A
    leak grows through a profiled step as through any other, so its changes
    there do not stand out and are kept as they are; nothing is made up where
    the others are few."""
    if not profiled or len(points) < 2:
        return points
    pairs = list(zip(points, points[1:], strict=False))
    touched = [x in profiled or x - 1 in profiled for _, (x, _) in pairs]
    kept = [(y - before) / (x - xb) for ((xb, before), (x, y)), t in zip(pairs, touched, strict=True)
            if not t and x > xb]
    if not kept:
        return points
    usual = median(kept)
    out, shift = [points[0]], 0.0
    for ((xb, before), (x, y)), t in zip(pairs, touched, strict=True):
        expected = usual * (x - xb)
        if t and (y - before) - expected > PROFILER_STAIR:
            shift += (y - before) - expected
        out.append((x, y - shift))
    return out


def memory_creep(steps: Steps, summaries: Summaries, min_steps: int = 8,
                 memory: list[list[_Memory]] | None = None) -> list[MemoryCreep]:
    """The ranks whose memory creeps (definition: the module docstring).
    ``memory``: ``per_rank_memory(steps, summaries)`` when the caller has it."""
    if memory is None:
        memory = per_rank_memory(steps, summaries)
    fits, jobs = {}, {}
    for r, mem in enumerate(memory):
        if len(mem) < min_steps or (fit := _fit(mem)) is None:
            continue
        if fit[2] == "rss":  # no measured allocator: the C heap, where the rank sent it
            heap = _heap_points((steps[r] if r < len(steps) else None) or [])
            if len(heap) >= MIN_FIT_POINTS:
                fit = (_slope(heap), heap, "heap")
        profiled = _profiled_steps((steps[r] if r < len(steps) else None) or [],
                                   (summaries[r] if r < len(summaries) else None) or [])
        fits[r] = fit
        jobs[r] = _without_profiler(fit[1], profiled) if profiled else fit[1]
    out = []
    for r, (slope, points, source) in sorted(fits.items()):
        # ranks compare on one signal: a heap slope against RSS slopes says nothing
        others = [f[0] for q, f in fits.items() if q != r and f[2] == source]
        total = slope * (points[-1][0] - points[0][0])
        floor = {"rss": MIN_RSS_CREEP_BYTES, "heap": MIN_HEAP_CREEP_BYTES}.get(
            source, MIN_CREEP_BYTES)
        # steady growth, and still so without the profiler's stairs (the figures
        # said are the measured ones: a profiler that lets go later nets out)
        if not (_steady(points, slope, floor)
                and (jobs[r] is points or _steady(jobs[r], _slope(jobs[r]), floor))):
            continue
        # only RSS is compared: it grows alike on every rank as the C allocator
        # keeps pages; allocated and heap growth is the rank's own
        if (source == "rss" and others and median(others) > 0
                and slope < CREEP_VS_OTHERS * median(others)):
            continue
        span = int(points[-1][0] - points[0][0]) + 1
        label = {"rss": "RSS", "cuda": "allocated",
                 "heap": "C heap in use"}.get(source, f"allocated, {source}")
        if source == "heap":
            rss = _rss_change(memory[r], points[0][0], points[-1][0])
            if rss is not None:
                label += f"; RSS {format_bytes(rss, signed=True)} over the same steps"
        first, last = int(points[0][0]), int(points[-1][0])
        out.append(MemoryCreep(r, slope, round(total), span, source,
                               f"rank {r}: memory creep, {format_bytes(slope, signed=True)} per "
                               f"step {creep_window(span, first, last)} ({label})",
                               first_step=first, last_step=last))
    return out


def creep_window(steps: int, first: int | None = None, last: int | None = None) -> str:
    """The steps a creep was fitted over, said as the window compared (the last
    ones measured), not as the leak's length: ``over steps 11-58, the last 48
    measured``; ``over the last 48 steps measured`` where the steps are unknown."""
    if first is None or last is None:
        return f"over the last {steps} steps measured"
    return f"over steps {first}-{last}, the last {steps} measured"


def _median(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return median(present) if present else None


def _peak(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


#: the %%torchprof step breakdown's roles (analysis.trace.steps, the TensorBoard
#: plugin's definitions), as a profiled-step summary carries them
ROLES = ("kernel", "memcpy", "memset", "comm", "runtime", "dataloader", "cpu_exec", "other")


class RoleBreakdown(msgspec.Struct):
    """One rank's median ``%%torchprof`` step breakdown over its profiled steps
    (ms per role of ``ROLES``, and the step), and how many profiled steps it
    rests on; None where the rank has no summary yet."""

    rank: int
    profiled: int = 0
    step_ms: float | None = None
    kernel_ms: float | None = None
    memcpy_ms: float | None = None
    memset_ms: float | None = None
    comm_ms: float | None = None
    runtime_ms: float | None = None
    dataloader_ms: float | None = None
    cpu_exec_ms: float | None = None
    other_ms: float | None = None

    def role_ms(self, role: str) -> float | None:
        """The median ms of ``role`` (one of ``ROLES``)."""
        value: float | None = getattr(self, f"{role}_ms")
        return value


def profiled_breakdown(summaries: Summaries) -> list[RoleBreakdown]:
    """One row per rank: the median over its profiled steps of the ``%%torchprof``
    step breakdown (``<role>_ms`` for each of ``ROLES``, and ``step_ms``), and how
    many profiled steps it rests on. Ranks without a summary yet have None."""
    out = []
    for r, sums in enumerate(summaries):
        sums = [s for s in sums or [] if isinstance(s.get("breakdown"), dict)]
        row = RoleBreakdown(rank=r, profiled=len(sums),
                            step_ms=_median([s.get("step_ms") for s in sums]))
        for role in ROLES:
            us = _median([s["breakdown"].get(f"{role}_us") for s in sums])
            setattr(row, f"{role}_ms", None if us is None else us / 1000)
        out.append(row)
    return out


def rank_table(steps: Steps, summaries: Summaries,
               per_rank: list[list[_Memory]] | None = None,
               window: int | None = None) -> list[dict[str, Any]]:
    """One row per rank: median step and phase times over its training steps
    (a labelled span, an evaluation or checkpoint, is no step; timed as the
    verdict times them, ``timed_ms``), its last
    ``window`` of them when given (the slow-rank verdict's window, so the
    rows and the verdict's median step are of the same steps), the latest and
    peak allocator figures, fragmentation and RSS. ``per_rank``:
    ``per_rank_memory(steps, summaries)`` when the caller has it."""
    out = []
    for r, memory in enumerate(per_rank if per_rank is not None
                               else per_rank_memory(steps, summaries)):
        training = [rec for rec in steps[r] or [] if not rec.labelled]
        # the verdict's times (GPU or host), so its median step is the table's
        timed = timed_ms(training)
        timed = timed[-window:] if window else timed
        row: dict[str, Any] = {"rank": r, "steps": len(training),
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
