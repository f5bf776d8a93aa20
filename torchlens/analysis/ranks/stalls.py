"""The stalling rank: a rank that now and then spends a long while outside its
collectives (a checkpoint it saves alone, an evaluation, a sleep, a burst of
I/O) while the other ranks wait for it inside theirs.

Pure functions over the per-step times of ``analysis.ranks.slow`` (``times[r]``:
one dict per compared step, in ms: the phases, ``step`` and ``other``), which
calls ``stalling_rank`` when its per-step rule names no rank.

Why a rule of its own: ``slow_rank`` compares medians over its window, and a
rank that stalls 100 ms every 10 steps arrives on time in 9 steps of 10, so
the medians hide it; the others' waits then look like noise.

Definitions (times in ms):

- A rank's *own* time in a step: the step less its ``sync`` (backward +
  collective, where it waits for the others: ``analysis.ranks.slow``), that is
  data + forward + optimizer + save + eval + other. A rank that waits for a stalled peer
  waits inside its sync, so its own time does not grow: a waiting rank is
  never the stalling one.
- A *stall* of rank ``r`` in step ``i``: its own time exceeds its median own
  time over the window by at least ``max(STALL_MIN_MS, STALL_STEPS x the median
  step)`` (10 ms and 2 steps: a scheduler that holds a rank back for a time
  slice or two on a loaded machine is no stall), and the other ranks waited
  for it: the median over them of their sync in step ``i`` or ``i + 1`` (the
  work a rank does after its optimizer step, before its next step begins,
  falls in its step ``i`` and the others wait in their step ``i + 1``) over
  their own median sync is at least ``WAITED`` (half) of the stall.
- The stalling rank: the rank with the most stalls, when it has at least
  ``MIN_STALLS`` (3: one or two a run are a loaded machine's hiccups; across
  24 healthy zoo runs of 60 steps no rank had more than one), at least
  ``STALL_SHARE`` (75%) of every rank's stalls (one rank stalls, not the
  machine), and its stalls span at least ``STALL_SPAN`` (a third) of the
  compared steps (a stall that recurs, not one slow burst, as a leak's
  growing heap gives).
- Window: the last ``STALL_WINDOW`` (60) steps every rank finished: a stall
  every 10 steps shows 6 times there, where the 20 steps of the per-step rule
  hold 2. 60 is under the 64 records per rank ``torchlens run``'s collector
  keeps, so the live views and the run folder judge the same steps.
- ``period``: the steps between consecutive stalls, when every gap is the same
  (``every 10 steps``); None otherwise.
- Where the stall's time went (``part``): the stalling rank's own time parts
  are data, compute (forward + optimizer), save (``torch.save``), eval (module
  forwards under ``no_grad``/``inference_mode``: ``capture.ranks.phases``) and
  other (outside every phase). Save or eval is the part when its median
  excess over the stalls is at least ``NAMED_SHARE`` (a tenth) of the
  stall (the larger of the two when both are): cause ``checkpoint`` or
  ``evaluation``. A tenth, not a half: those timers see only the call
  itself, and a checkpoint's ``state_dict`` copies, its temporary file and
  its copy to slower storage fall outside ``torch.save`` (the zoo's
  checkpoint job: 20-39 ms of ``torch.save`` in stalls of about 125 ms),
  while a rank that saves on no other step has no save time to exceed, and
  a plain sleep none at all; a rank that saves a little every step and
  sleeps now and then has no save excess at its stalls. Otherwise the
  part of data, compute and other whose median excess is largest. ``other``
  (time no phase timer saw: a sleep, logging or I/O between the optimizer
  step and the next step, a save the job makes some other way) is the cause
  ``stall``; the step records cannot say what the rank did then, so the
  sentence says what was measured.
- ``wait_per_step_ms``: the others' waits summed over the stalls, divided by
  the compared steps: what the stalls cost every step on average (the figure
  ``analysis.ranks.slow.weak`` reads).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from statistics import median

from torchlens.model.findings import SLOW_RANK, WARNING, Figure, Finding
from torchlens.model.units import format_ms

#: steps compared: the last this many every rank finished (module docstring)
STALL_WINDOW = 60
#: a stall: own time over its median by this many median steps, and this many ms
STALL_STEPS = 2.0
STALL_MIN_MS = 10.0
#: the others' sync must rise by this share of the stall (they waited for it)
WAITED = 0.5
MIN_STALLS = 3
STALL_SHARE = 0.75
STALL_SPAN = 1 / 3
#: the parts of a rank's own time, and the cause each names
OWN_PARTS = {"data": ("data",), "compute": ("forward", "optimizer"), "save": ("save",),
             "eval": ("eval",), "other": ("other",), "gc": ("gc",), "runq": ("runq",)}
CAUSE = {"data": "data", "compute": "compute", "save": "checkpoint", "eval": "evaluation",
         "other": "stall", "gc": "gc", "runq": "cpu_contention"}
#: a save or an evaluation names the stall from this share of its excess on
NAMED_SHARE = 0.1
#: garbage collection and the wait for a CPU run inside the phases: they name
#: the stall when they explain half of it
HOST_SHARE = 0.5
NAMED_PARTS = ("save", "eval", "gc", "runq")
#: parts timed after a step's optimizer step, before the next step's first phase
#: (a save or an evaluation as time outside every phase): they delay step i + 1
BETWEEN_STEPS = ("other", "save", "eval")
PART_WORDS = {"data": "in data loading", "compute": "in forward and optimizer work",
              "save": "saving a checkpoint (torch.save)",
              "eval": "evaluating (module forwards under no_grad or inference_mode)",
              "other": "outside every training phase (after its optimizer step, before its "
                       "next step: time no phase timer saw)",
              "gc": "in Python garbage collections",
              "runq": "waiting for a CPU (another process or thread on its cores)"}
ADVICE = {
    "stall": "find what rank {r} does alone between two steps, {when} (a checkpoint save, an "
             "evaluation, logging or I/O on one rank): do it on every rank, asynchronously "
             "or less often",
    "checkpoint": "rank {r} saves a checkpoint alone {when} while the others wait: save "
                  "asynchronously (torch.distributed.checkpoint.async_save) or less often, "
                  "or shard the save over every rank",
    "evaluation": "rank {r} evaluates alone {when} while the others wait: evaluate on every "
                  "rank (each a shard of the validation set) or less often",
    "data": "look at rank {r}'s input pipeline {when}: a shard with slow samples, a worker "
            "that restarts, storage that stalls",
    "compute": "look at what rank {r} computes {when} beyond the others (an extra forward, a "
               "larger batch now and then)",
    "gc": "rank {r}'s full garbage collections {when} walk many live Python objects: "
          "gc.freeze() after set-up, fewer long-lived objects, or gc.collect() at a chosen "
          "point",
    "cpu_contention": "find the process sharing rank {r}'s cores {when} (top -H, CPU "
                      "affinity): pin ranks apart",
}


@dataclass(frozen=True)
class Stall:
    """One stall: the step (its number), how far the rank's own time exceeded
    its median, the others' wait for it, and the excess by part."""

    step: int
    excess_ms: float
    waited_ms: float
    parts: dict[str, float]


@dataclass(frozen=True)
class Stalls:
    """The stalling rank of a window (module docstring)."""

    rank: int
    stalls: list[Stall]
    steps: int  # steps compared
    all_stalls: int  # every rank's, this rank's included
    period: int | None
    part: str  # the own-time part the stalls' time went to (``OWN_PARTS``)
    wait_in: str  # where the others waited: backward or collective

    @property
    def cause(self) -> str:
        return CAUSE[self.part]

    @property
    def stall_ms(self) -> float:
        return median(s.excess_ms for s in self.stalls)

    @property
    def waited_ms(self) -> float:
        return median(s.waited_ms for s in self.stalls)

    @property
    def wait_per_step_ms(self) -> float:
        return sum(s.waited_ms for s in self.stalls) / self.steps if self.steps else 0.0


def _sync(x: dict[str, float]) -> float:
    return x["backward"] + x["collective"]


def _own(x: dict[str, float]) -> float:
    return max(0.0, x["step"] - _sync(x))


def stall_floor_ms(step_ms: float) -> float:
    """A rank's own time must exceed its median by this to be a stall."""
    return max(STALL_MIN_MS, STALL_STEPS * step_ms)


def stall_events(times: dict[int, list[dict[str, float]]], numbers: list[int],
                 step_ms: float) -> dict[int, list[Stall]]:
    """Every rank's stalls in the window (``numbers``: the compared steps' numbers)."""
    ranks = sorted(times)
    n = len(numbers)
    own = {r: [_own(x) for x in times[r]] for r in ranks}
    sync = {r: [_sync(x) for x in times[r]] for r in ranks}
    base_own = {r: median(own[r]) for r in ranks}
    base_sync = {r: median(sync[r]) for r in ranks}
    floor = stall_floor_ms(step_ms)
    out: dict[int, list[Stall]] = {r: [] for r in ranks}
    for r in ranks:
        base_part: dict[str, float] = {}
        for i in range(n):
            excess = own[r][i] - base_own[r]
            if excess < floor:
                continue
            waited = median(max(sync[q][j] for j in (i, i + 1) if j < n) - base_sync[q]
                            for q in ranks if q != r)
            if waited < WAITED * excess:
                continue
            if not base_part:  # only a rank that stalled: most ranks of a large job never do
                base_part = {p: median(sum(x.get(k, 0.0) for k in keys) for x in times[r])
                             for p, keys in OWN_PARTS.items()}
            parts = {p: sum(times[r][i].get(k, 0.0) for k in keys) - base_part[p]
                     for p, keys in OWN_PARTS.items()}
            out[r].append(Stall(numbers[i], excess, waited, parts))
    return out


def stalling_rank(times: dict[int, list[dict[str, float]]], numbers: list[int],
                  step_ms: float) -> Stalls | None:
    """The rank whose stalls the others wait for (module docstring), or None."""
    if len(times) < 2 or not numbers:
        return None
    events = stall_events(times, numbers, step_ms)
    counts = Counter({r: len(s) for r, s in events.items()})
    total = sum(counts.values())
    if not total:
        return None
    rank = min(counts, key=lambda r: (-counts[r], r))
    stalls = events[rank]
    k, n = len(stalls), len(numbers)
    if k < MIN_STALLS or k < STALL_SHARE * total:
        return None
    if stalls[-1].step - stalls[0].step < STALL_SPAN * n:
        return None
    gaps = {b.step - a.step for a, b in zip(stalls, stalls[1:], strict=False)}
    period = gaps.pop() if len(gaps) == 1 else None
    excess = {p: median(s.parts[p] for s in stalls) for p in OWN_PARTS}
    stall_ms = median(s.excess_ms for s in stalls)
    named = [p for p in NAMED_PARTS if excess[p] >= (
        HOST_SHARE if p in ("gc", "runq") else NAMED_SHARE) * stall_ms]
    part = max(named or [p for p in OWN_PARTS if p not in NAMED_PARTS], key=excess.__getitem__)
    # where the others waited: the sync part that rose most, over them and the stalls
    others = [q for q in times if q != rank]
    index = {s: i for i, s in enumerate(numbers)}

    def rise(phase: str) -> float:
        vals = []
        for s in stalls:
            i = index[s.step]
            for q in others:
                base = median(x[phase] for x in times[q])
                vals.append(max(times[q][j][phase] for j in (i, i + 1) if j < n) - base)
        return median(vals)

    wait_in = max(("backward", "collective"), key=rise)
    return Stalls(rank, stalls, n, total, period, part, wait_in)


def stall_steps(st: Stalls) -> list[int]:
    """The steps the stalls are named by: the step records', numbered from 0 as
    ``enumerate`` counts a loop's iterations. A record runs from a step's first
    phase to the next step's first phase, so time outside every phase in
    record ``i`` is either inside iteration ``i`` (after its batch arrived) or
    at the top of iteration ``i + 1`` (before its batch): the records cannot
    tell which, and the finding says so rather than guess."""
    return [s.step for s in st.stalls]


def stall_finding(st: Stalls, step_ms: float, compared: str, timed: str = "") -> Finding:
    """The slow-rank finding of a stalling rank: what was measured, how often,
    how long the others waited and where. ``compared``: ``of the last 60
    steps``; ``timed``: how the phases were timed (``slow.timed_words``)."""
    when = f"every {st.period} steps" if st.period else "now and then"
    how_often = (f"every {st.period} steps" if st.period
                 else f"in {len(st.stalls)} {compared}")
    where = ("in their backward (DDP's gradient all-reduce)" if st.wait_in == "backward"
             else "in their collectives")
    named = stall_steps(st)
    steps = ", ".join(str(s) for s in named[:8]) + (", ..." if len(named) > 8 else "")
    top = (" (counted from 0; a pause at the top of the loop, before its batch, counts in "
           "the step before)" if st.part in BETWEEN_STEPS else " (counted from 0)")
    sentence = (f"rank {st.rank} is the slow rank: {how_often} it spends "
                f"{format_ms(st.stall_ms)} more than its usual step {PART_WORDS[st.part]}, "
                f"and the others wait {format_ms(st.waited_ms)} for it {where} "
                f"({len(st.stalls)} stalls {compared}: in steps {steps}{top}; the others "
                f"waiting {format_ms(st.wait_per_step_ms)} per step on average over those "
                f"{st.steps} steps, whose median is {format_ms(step_ms)})"
                + (f"; {timed}" if timed else ""))
    figures = (Figure("rank", st.rank), Figure("cause", st.cause),
               Figure("stalls", len(st.stalls)), Figure("stall_ms", st.stall_ms, "ms"),
               Figure("waited_ms", st.waited_ms, "ms"),
               *((Figure("period_steps", st.period, "steps"),) if st.period else ()),
               Figure("wait_per_step_ms", st.wait_per_step_ms, "ms"),
               Figure("steps_compared", st.steps), Figure("median_step_ms", step_ms, "ms"))
    advice = ADVICE[st.cause].format(r=st.rank, when=when)
    return Finding(WARNING, sentence, figures, advice, code=SLOW_RANK)
