"""The recompiling rank: a rank whose ``torch.compile`` recompiles (a guard that
failed: a new shape, dtype or flag) while the other ranks wait for it.

Pure functions over the step records (``StepRecord.compiled``: each step's
compiles, with the guard that failed) and the per-step times of
``analysis.ranks.slow`` (``times[r]``: one dict per compared step, in ms; its
``recompile`` is the step's recompile time). ``slow_rank`` asks this rule
when its per-step rule names no rank, before the stall rule: a recompile is
a stall whose cause torch itself recorded.

Why a rule of its own: a rank that recompiles at steps 12 and 27 arrives on
time in every other step, so the per-step rule's medians hide it, and two
stalls are under the stall rule's three (which keeps a loaded machine's
hiccups out). A recompile needs no count: torch says it happened and why.

Definitions (times in ms):

- A rank's *recompile* in step ``i``: its recompile time there (compiles whose
  ``recompile_reason`` is set; a frame's first compile is not one: every rank
  compiles at its first steps) is at least ``stall_floor_ms`` (10 ms and two
  median steps: less is no stall), and at least twice the others' median
  recompile time in that step (they did not recompile alike);
- the others *waited* for it: the median over them of their sync (backward +
  collective) in step ``i`` or ``i + 1`` (the wait lands in whichever step
  their next collective is in) above their median sync is at least
  ``WAITED`` of its recompile time;
- the recompiling rank: the rank with the most recompile time so waited for,
  at least ``SHARE`` of every rank's (one rank recompiles, not all).

Its finding names the steps, the guard that failed and where, the time each
recompile took and how long the others waited.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from statistics import median

from torchlens.analysis.ranks.stalls import stall_floor_ms
from torchlens.analysis.trace.compiled import (
    RECOMPILE,
    guard_line,
    recompile_advice,
    recompiles,
    user_code,
)
from torchlens.model.compiled import CompileLog
from torchlens.model.findings import INFO, SLOW_RANK, WARNING, Figure, Finding
from torchlens.model.records import StepRecord
from torchlens.model.units import format_ms

#: the others' extra wait against the recompile time that makes it waited for
WAITED = 0.5
#: the recompiling rank's share of every rank's recompile time waited for
SHARE = 0.75
CAUSE = "recompile"
ADVICE = ("rank {r}'s inputs change shape (or dtype, or a flag the compiled code reads) "
          "where the others' do not: pad or bucket its shapes, or mark the dimension "
          "dynamic (torch._dynamo.mark_dynamic) so one graph serves them; TORCH_LOGS="
          "recompiles prints each guard as it fails")


@dataclass(frozen=True)
class Recompiled:
    """The recompiling rank (module docstring): its steps, each one's recompile
    time and the others' wait then, and the guards that failed."""

    rank: int
    steps: list[int]
    compile_ms: list[float]
    waited_ms: list[float]
    guards: list[str]  # "forward (net.py:41): tensor 'x' size mismatch ..."
    compared: int  # steps compared

    @property
    def wait_per_step_ms(self) -> float:
        return sum(self.waited_ms) / self.compared if self.compared else 0.0


def recompile_ms(rec: StepRecord) -> float:
    """The step's recompile time: its compiles a failed guard made (ms)."""
    log = rec.compiled
    if not isinstance(log, CompileLog):
        return 0.0
    return 1e3 * sum(f.compile_s or 0.0 for f in log.frames if f.recompile_reason)


def _sync(x: Mapping[str, float]) -> float:
    return x["backward"] + x["collective"]


def recompiling_rank(times: dict[int, list[dict[str, float]]], numbers: list[int],
                     records: dict[int, dict[int, StepRecord]], step_ms: float
                     ) -> Recompiled | None:
    """The recompiling rank of the steps ``numbers`` (``times``: each rank's
    per-step times, in their order; ``records``: each rank's step records by
    step number), or None (module docstring)."""
    ranks = sorted(times)
    if len(ranks) < 2 or not numbers:
        return None
    floor = stall_floor_ms(step_ms)
    usual = {r: median(_sync(x) for x in times[r]) for r in ranks}
    found: dict[int, list[tuple[int, float, float]]] = {r: [] for r in ranks}
    for i, step in enumerate(numbers):
        for r in ranks:
            own = times[r][i]["recompile"]
            if own < floor:
                continue
            others = [q for q in ranks if q != r]
            if median(times[q][i]["recompile"] for q in others) * 2 > own:
                continue
            waits = [median(_sync(times[q][j]) - usual[q] for q in others)
                     for j in (i, i + 1) if j < len(numbers)]
            waited = max(waits)
            if waited >= WAITED * own:
                found[r].append((step, own, waited))
    total = {r: sum(own for _, own, _ in found[r]) for r in ranks}
    everyone = sum(total.values())
    rank = max(ranks, key=lambda r: (total[r], -r))
    if not found[rank] or total[rank] < SHARE * everyone:
        return None
    named: list[tuple[bool, str]] = []
    for step, _, _ in found[rank]:
        log = records[rank][step].compiled
        if isinstance(log, CompileLog):
            for rc in recompiles(log):
                words = f"{rc.function} ({rc.where}): {guard_line(rc.guard)}"
                if all(words != w for _, w in named):
                    named.append((user_code(rc.file), words))
    # the user's own functions first: torch's wrappers (DDP's, the compiled
    # module's) recompile on the same guard and say less
    guards = [w for _, w in sorted(named, key=lambda uw: not uw[0])]
    return Recompiled(rank, [s for s, _, _ in found[rank]], [o for _, o, _ in found[rank]],
                      [w for _, _, w in found[rank]], guards, len(numbers))


def recompile_finding(rc: Recompiled, step_ms: float, compared: str, timed: str = "") -> Finding:
    """``rank 1 is the slow rank: it recompiled at steps 12 and 27 (guard
    failed: forward (net.py:41): tensor 'x' size mismatch ...), 512.0 ms each;
    the others waited 498.0 ms each time ...``."""
    steps = rc.steps
    named = (", ".join(map(str, steps[:-1])) + f" and {steps[-1]}" if len(steps) > 1
             else str(steps[0]))
    each = " each" if len(steps) > 1 else ""
    guard = rc.guards[0] if rc.guards else "the guard is not recorded"
    more = f" (and {len(rc.guards) - 1} more)" if len(rc.guards) > 1 else ""
    took, waited = median(rc.compile_ms), median(rc.waited_ms)
    sentence = (f"rank {rc.rank} is the slow rank: it recompiled at step"
                f"{'s' if len(steps) > 1 else ''} {named} (guard failed: {guard}{more}), "
                f"{format_ms(took)}{each}; the others waited {format_ms(waited)}"
                f"{' each time' if len(steps) > 1 else ''} ({len(steps)} {compared}, "
                f"whose median step is {format_ms(step_ms)}; steps counted from 0)"
                + (f"; {timed}" if timed else ""))
    figures = (Figure("rank", rc.rank), Figure("cause", CAUSE),
               Figure("recompiles", len(steps)), Figure("recompile_ms", took, "ms"),
               Figure("waited_ms", waited, "ms"),
               Figure("wait_per_step_ms", rc.wait_per_step_ms, "ms"),
               Figure("steps_compared", rc.compared), Figure("median_step_ms", step_ms, "ms"))
    advice = ADVICE.format(r=rc.rank)
    if rc.guards and "size mismatch" not in rc.guards[0]:  # a value, not a shape
        advice = f"rank {rc.rank}: " + recompile_advice(rc.guards[0])
    return Finding(WARNING, sentence, figures, advice, code=SLOW_RANK,
                   details={"steps": list(steps), "guards": list(rc.guards)})


#: the steps a run's recompiles finding names at most, per rank
NAMED_STEPS = 5


class RunRecompiles:
    """Every recompile of a run's ranks, from all their step records (a run
    folder read once, ``add`` per record): for the report's finding when
    the slow-rank verdict, which judges the last steps only, no longer sees
    one (``run_recompiles_finding``)."""

    def __init__(self) -> None:
        #: rank -> [(step, compile ms, guard words)]
        self.by_rank: dict[int, list[tuple[int, float, str]]] = {}
        self.ranks: set[int] = set()

    def add(self, rank: int, rec: StepRecord) -> None:
        self.ranks.add(rank)
        log = rec.compiled
        if not isinstance(log, CompileLog):
            return
        found = recompiles(log)
        if not found:
            return
        user = [rc for rc in found if user_code(rc.file)] or found
        guard = f"{user[0].function} ({user[0].where}): {guard_line(user[0].guard)}"
        self.by_rank.setdefault(rank, []).append((rec.step, recompile_ms(rec), guard))


def run_recompiles_finding(seen: RunRecompiles, verdict: Finding | None) -> Finding | None:
    """The run's recompiles, when some rank recompiled and the verdict does not
    already name a recompile; None otherwise. One rank (or some) recompiling
    while others did not is a warning (the others waited at those steps);
    every rank alike, information."""
    if not seen.by_rank or (verdict is not None and verdict.value("cause") == CAUSE):
        return None
    parts = []
    for rank, hits in sorted(seen.by_rank.items()):
        steps = [s for s, _, _ in hits]
        named = ", ".join(map(str, steps[:NAMED_STEPS])) + (
            f" and {len(steps) - NAMED_STEPS} more" if len(steps) > NAMED_STEPS else "")
        took = median(ms for _, ms, _ in hits)
        parts.append(f"rank {rank} at step{'s' if len(steps) > 1 else ''} {named} "
                     f"(guard failed: {hits[0][2]}), {format_ms(took)}"
                     f"{' each' if len(steps) > 1 else ''}")
    alike = len(seen.by_rank) == len(seen.ranks) > 1 and len(
        {tuple(s for s, _, _ in hits) for hits in seen.by_rank.values()}) == 1
    severity = INFO if alike else WARNING
    some = sorted(seen.by_rank)
    return Finding(
        severity, "torch.compile recompiled during the run: " + "; ".join(parts)
        + ("" if alike else "; the other ranks waited for it at those steps")
        + " (every step record of the run; the slow-rank verdict judges the last steps)",
        (Figure("rank_count", len(some)),
         Figure("recompiles", sum(len(h) for h in seen.by_rank.values()))),
        recompile_advice(next(iter(seen.by_rank.values()))[0][2]),
        "recompiles during the run", details={"ranks": some}, code=RECOMPILE)
