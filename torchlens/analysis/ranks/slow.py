"""The slow rank of ``%ddp_check --profile``, ``torchlens run`` and the watch:
which rank the others wait for, and why.

Pure functions over the step records of docs/RANK_PROFILE.md (``steps[r]``: one
list per rank), on the growing window of a live run (twice a second) and on the
finished run.

Definitions (times in ms; a phase that is null or missing counts as 0, since
its timer never ran; ``other`` as ``analysis.ranks.steps`` defines it):

- Phase and step times: a rank that sends GPU times (``StepRecord.gpu``: time
  between CUDA events its stream reached at the phase boundaries) is compared
  on them, on the steps whose GPU times have arrived; any other rank on its
  host timers. NCCL work is enqueued and the CPU moves on, so on the host a
  wait for a late rank shows in whichever phase next blocks on the GPU; on the
  GPU it shows where the stream waits for the collective (the end of DDP's
  backward, a synchronous collective). The sentence says which ranks were
  measured how.

- ``compute`` = forward + optimizer + save + eval + other: the rank's own work
  outside data loading and synchronisation. When ``compute`` is the cause, it
  is named by the share of it whose excess is largest (``COMPUTE_SHARES``):
  forward + optimizer (``compute``), ``save`` (``checkpoint``), ``eval``
  (``evaluation``) or ``other`` (``stall``: time no phase timer saw, a sleep,
  logging or I/O between steps; only on a rank whose forward was timed: on
  one without DDP or FSDP, other holds the forward). A rank that sleeps in every step is not
  slow at its forward and optimizer, and the advice for those (unequal
  batches, a slower device) would send its user the wrong way.
- On a rank timed on its GPU, ``save`` and ``eval`` are the host record's
  (the GPU timer does not bracket them), taken out of the GPU's ``other``.
- ``sync`` = backward + collective: where a rank waits for the others. DDP
  waits for its gradient all_reduces inside ``backward`` (in C++), explicit
  collectives wait inside ``collective``. Both are sync because the rank that
  arrives last at either is the one the others wait for; leaving out
  ``collective`` would miss a slow rank whose peers wait in a logging
  all_reduce after the optimizer, or in one before backward. With no backward
  at all (explicit all_reduce loops), sync is the collectives alone.
- Steps compared: training steps only. A span a framework labels as no
  training step (``StepRecord.label``: the Hugging Face Trainer's
  ``evaluation`` or ``checkpoint``, ``torchlens.integrations``) is left out:
  an evaluation is longer than a step by design, and a rank that saves the
  checkpoint alone (rank 0) is not the rank the others wait for in training.
  Of the training steps, the steps every rank has (a rank that died or lags adds only
  the steps it finished; a rank with no record yet is left out), the last
  ``WINDOW`` (20) of them. One window for every view (the ``%ddp_check``
  checklist and its live section, ``slow_rank()``, ``torchlens run``, the
  watch, a run folder's report), so they give one verdict with one set of
  figures: the last steps rather than all, because the live views recompute
  it twice a second on runs of any length and ``torchlens run``'s collector
  keeps only each rank's newest records. The sentence says which steps:
  ``last in 12 of 12 steps`` when every common step was compared, ``last in
  19 of the last 20 steps`` when the window left older ones out. Steps pair by their index, also fixed windows
  (``window: true``), which then pair only roughly.
- Per step: the *late* rank is the one with the least sync; the others waited
  ``median(sync of the others) - its sync`` for it. A step in which that is
  under 1 us (the clocks' resolution: equal ranks) has no late rank.
- The rank late in the most steps (ties: the lowest rank) is the candidate:
  ``late_share`` = its share of the steps, ``gap_ms`` = the median over the
  steps of how long the others waited for it (every step of the window, not
  only those it was last in).
- It is the slow rank when the evidence holds across the steps, not in one
  median (on a 2-core machine the scheduler holds one of 4 CPU
  ranks back now and then, and a fixed ratio named it in most even runs):

  1. ``late_share`` >= 50%, and arriving last that often is unlikely by
     chance: if each of the ``R`` compared ranks were equally likely to be
     late in a step, the binomial chance of k or more late steps of the n'
     steps some rank was late in (a tie under 1 us tells nothing) is
     under ``STANDOUT_P`` (5%) / R (Bonferroni over the ranks, as the
     profiled window's ``analysis.runs.slow_ranks``, which asks for 1%:
     here test 3 holds the wait to its spread too). A growing window needs
     enough steps for that: 6 of 6 with 2 ranks, 4 of 4 with 4; 10 of 12
     with 2. Or, with few steps, it was late in ``FEW_SHARE`` (80%) of at
     least ``FEW_STEPS`` (4) and the median wait is ``FEW_DISPERSION`` (3x)
     the others' spread (a 2-rank Accelerate loop of 4 steps, a Trainer's
     6 steps late in 5);
  2. ``gap_ms`` >= 5% of the median step and >= 0.5 ms (the noise floor);
  3. the median wait >= ``DISPERSION`` (1x) the robust spread of the other
     ranks' own wait (their median sync) over the same n' steps (1.4826 x
     its median absolute deviation, ``chance.robust_spread``): on an even
     run the others' waits move by 10-30 ms from step to step and the rank
     late most often is waited for 1.5 ms; a straggler's wait stands above
     that spread.
     Arriving last so often that the chance is under ``ORDER_P`` (0.1%) / R
     is enough without it (18 of 20 steps with 2 ranks): on a loaded
     machine a rank with 32x the others' batch was last in 19 of 20 steps,
     waited for 6.7 ms a step, while the others' own waits swung by 23 ms.

  4. when no measured part explains it (cause None), it arrived last in at
     least ``UNEXPLAINED_SHARE`` (90%) of the steps: the scheduler of a
     machine with fewer free cores than ranks holds one rank back for a
     while and then another (seen on even 4-rank runs: last in 12 of 20
     steps, 8 ms a step, every part equal to the others'), where a lag
     nothing measured explains but that is the rank's own is there in
     every step.

  5. or, whatever 1, 3 and 4 say, it waited for a CPU (``StepRecord.host``:
     its run-queue wait, the mean per step) at least ``CONTENDED_RATIO``
     (3x) the others' median, by more than the noise floor and half the
     others' wait for it, and its own time on a CPU does not explain that
     (more work queues longer on a busy machine): cause ``cpu_contention``,
     measured, not inferred. A rank whose core another process shares
     loses its time in backward, where the others' wait for it lands too, so
     its order is weak evidence: with a busy process on rank 1's core, on a
     quiet 2-core machine, rank 1 waited 5.7 ms a step for a CPU against rank
     0's 0.8 ms, and was last in 13 of 20 steps by 1.6 ms a step.

  A candidate that passes 1's share and 2 but fails a test is no verdict:
  the sentence says it arrived last in k of n steps and that this is not
  significant.
- Second look: when the last ``WINDOW`` steps name no rank and the run has
  more, the last ``LONG_WINDOW`` (60) are judged again with test 1's order
  alone at ``ORDER_P`` (tests 2 and 4 and the cause as above; test 3 left
  out: over many steps the order is the evidence). On a loaded 2-core machine a
  rank with 32x the others' batch was last in 14 of the last 20 steps, waited
  for 2.7 ms a step against the others' own ± 5.0 ms: not significant there,
  and last in 50 of the last 60. A verdict from it says so: ``last in 45 of the last
  60 steps``.
- Cause: per step, the candidate's part minus the median of the others' part,
  median over the steps (its *excess*); which part (``data`` or ``compute``)
  is the cause is ``cause_of``'s rule below, with ``gap_ms`` as the wait.
  When step times are equal the two excesses add up to the gap, so one of
  them explains it; when neither does, cause is None and the words say so.
- Cause ``collective``: with ``collective`` in sync, a rank held up by its own
  collectives (a gather to itself, a subgroup collective, a p2p receive) has
  as much sync as the others and is not found. So when no rank is found and
  the ranks do run backward, the rule is applied again with sync = backward
  alone, and its answer is kept only when ``cause_of`` names
  ``collective`` among data, compute and collective, and only when its arrival
  order is beyond doubt (``ORDER_P``: a second hypothesis, tried after the
  first found nothing). Without backward the late rank has
  the least collective time by definition: collective is never its cause.
- ``median_step_ms``: the median over ranks of each rank's median step time in
  the window; ``skew_pct`` = (the largest of those - that median) / that
  median x 100. When no rank is slow, ``rank`` and ``cause`` are None and
  ``gap_ms``/``late_share`` are those of the rank late most often.

The cause (``cause_of``; the one rule for every view, the multi-rank run's
profiled-step roles included): of a rank's parts, the one with the largest
excess over the others' median, when that excess is at least
``max(MIN_GAP_MS, MIN_GAP_SHARE x the median step)`` (0.5 ms and 5%: the
floor under which a wait is noise), the rank spends at least ``MIN_RATIO``
(1.2x) the others' median in it (any time, when theirs is 0), and, where the
wait per step is measured on the same steps (the step records here), the
excess explains at least ``EXPLAINS`` (half) of it. The sentence
(``slow_rank_finding``): ``rank R is the slow rank: its data loading took 40.0
ms per step, 4.0x the others' median (10.0 ms); the others waited 30.0 ms per
step for it (last in 18 of 20 steps)``, with advice for the part.

Known blind spots: a rank whose backward itself computes slowly keeps the
others waiting inside the same ``backward`` timer; all ranks then leave
backward together and no rank stands out here (its profiled steps show it).
Host timers see a wait only where the host blocks: always with gloo; with
NCCL only where the host synchronises the device at the end of a phase.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from statistics import mean, median

from torchlens.analysis.ranks.chance import binomial_tail, robust_spread
from torchlens.analysis.ranks.recompiles import ADVICE as RECOMPILE_ADVICE
from torchlens.analysis.ranks.recompiles import (
    recompile_finding,
    recompile_ms,
    recompiling_rank,
)
from torchlens.analysis.ranks.stalls import STALL_WINDOW, stall_finding, stalling_rank
from torchlens.analysis.ranks.steps import PHASES, Steps, gpu_ms, gpu_steps, record_ms
from torchlens.model.findings import NA, PASSED, SLOW_RANK, WARNING, Figure, Finding
from torchlens.model.records import GpuStepTimes, HostStep, StepRecord
from torchlens.model.units import format_duration, format_ms, format_percent

#: steps compared: the last this many that every rank finished (module docstring)
WINDOW = 20
MIN_LATE_SHARE = 0.5
#: arriving last that often must be less likely than this by chance (over all
#: ranks); looser than the profiled window's 1%, as the wait's spread is tested too
STANDOUT_P = 0.05
#: the median wait against the waits' robust spread over the steps
DISPERSION = 1.0
#: arriving last this unlikely by chance (over all ranks) is evidence enough
#: without test 3: 18 of 20 steps with 2 ranks (on a loaded machine the
#: others' own waits swing by more than a straggler's 7 ms, step to step)
ORDER_P = 0.001
#: few steps: late in all of at least this many, by a wait this many spreads large
FEW_STEPS = 4
FEW_SHARE = 0.8
FEW_DISPERSION = 3.0
#: an unexplained rank must arrive last in this share of the steps (test 4)
UNEXPLAINED_SHARE = 0.9
#: the second look (module docstring): when the last WINDOW steps name no rank,
#: the last this many, where arriving last must be beyond doubt by itself; the
#: stall rule's window, under the 64 records per rank the collector keeps, so
#: the live view and the run folder judge the same steps
LONG_WINDOW = 60
#: a wait, or a part's excess, under both of these is noise
MIN_GAP_SHARE = 0.05  # of the median step
MIN_GAP_MS = 0.5
TIE_MS = 1e-3  # below the clocks' resolution: nobody arrived last
EXPLAINS = 0.5  # share of the wait a part's excess must reach to be the cause
MIN_RATIO = 1.2  # the rank's time in the part against the others' median

_PARTS: dict[str, Callable[[dict[str, float]], float]] = {
    "data": lambda x: x["data"],
    "compute": lambda x: x["forward"] + x["optimizer"] + x["save"] + x["eval"] + x["other"],
    "collective": lambda x: x["collective"],
    # the shares of compute (module docstring), each named for its cause
    "forward": lambda x: x["forward"] + x["optimizer"],
    "checkpoint": lambda x: x["save"],
    "evaluation": lambda x: x["eval"],
    "stall": lambda x: x["other"],
    # host time inside compute's phases (``StepRecord.host``)
    "gc": lambda x: x["gc"],
    "cpu_contention": lambda x: x["runq"],
    # the training thread's time on a CPU: its work, whatever the machine's load
    "cpu": lambda x: x["cpu"],
    # torch.compile's recompiles in the step (``StepRecord.compiled``)
    "recompile": lambda x: x["recompile"],
}
COMPUTE_SHARES = ("forward", "checkpoint", "evaluation", "stall")
#: what compute's excess is named by when it explains ``EXPLAINS`` of it
HOST_CAUSES = ("gc", "cpu_contention")
#: the causes a rank's own memory creep can make (its allocations slow its
#: forward and optimizer work, or the user code between phases that keeps the
#: memory: a stall; its growing heap lengthens each collection): on a creeping
#: slow rank the creep leads these, never data loading, saving or contention
LEAK_MADE_CAUSES = (None, "compute", "forward", "stall", "gc")
#: the causes a memory creep leads on any rank (``creep_leads``)
NEIGHBOUR_MADE_CAUSES = ("compute", "forward")
#: a part's words: the step records' parts, then the ``%%torchprof`` step
#: breakdown's roles that a multi-rank run's profiled steps carry (in the
#: order ties are broken; ``comm`` and ``other`` are never a cause: waiting for
#: the slow rank is what fills them on the others)
PART_WORDS = {"data": "data loading", "compute": "forward, optimizer and other work",
              "collective": "own collectives",
              "checkpoint": "checkpoint saving (torch.save)",
              "evaluation": "evaluation (module forwards under no_grad)",
              "stall": "time outside every timed phase (a sleep, logging or I/O no phase "
                       "timer saw)",
              "gc": "Python garbage collection (on average: full collections come every "
                    "few steps)",
              "cpu_contention": "wait for a CPU (on average; runnable, with another process "
                                "or thread on its cores)",
              "recompile": "recompiling (torch.compile's guards failing; on average)",
              "dataloader": "data loading", "cpu_exec": "CPU work in ops",
              "kernel": "GPU kernel time", "memcpy": "memcpy time", "memset": "memset time",
              "runtime": "CUDA runtime calls"}
#: what to look at, per kind of part (a role's kind: ``_KIND``); None: no part explains it
ADVICE = {
    "data": "look at rank {r}'s input pipeline: give its DataLoader more workers or faster "
            "storage, or check whether its shard holds larger samples",
    "compute": "look at rank {r}'s host and device: unequal batch or sequence sizes, another "
               "process on its device or cores, throttling or a slower device; its profiled "
               "steps show which ops",
    "collective": "look at the collectives only rank {r} makes (a gather to it, a subgroup or "
                  "point-to-point call): move that work out of the step or share it",
    "checkpoint": "rank {r} saves checkpoints in its steps while the others wait: save "
                  "asynchronously or less often, or share the save over every rank",
    "evaluation": "rank {r} evaluates in its steps while the others wait: evaluate on every "
                  "rank (a shard each) or less often",
    "stall": "find what rank {r} does between its phases that no timer saw (a sleep, "
             "logging, I/O, a synchronous copy): move it out of the step or onto every rank",
    "gc": "rank {r}'s garbage collections walk many live Python objects: gc.freeze() after "
          "set-up, fewer long-lived objects, or gc.collect() at a chosen point",
    "cpu_contention": "find the process sharing rank {r}'s cores (top -H, its CPU affinity): "
                      "pin ranks apart or move the other work off their cores",
    "recompile": RECOMPILE_ADVICE,
    None: "open rank {r}'s profiled steps on the timeline to see where its time goes",
}
_KIND = {"data": "data", "dataloader": "data", "collective": "collective",
         "checkpoint": "checkpoint", "evaluation": "evaluation", "stall": "stall", "gc": "gc",
         "cpu_contention": "cpu_contention", "recompile": "recompile"}
#: How a rank's phase times were measured (``SlowRank.timed_by``), in the sentence.
TIMED = {"gpu": "GPU time between CUDA events", "host": "host timers"}
HOST_CAVEAT = "with NCCL the wait shows in the phase that next blocks on the GPU"


def on_cpu(recs: Iterable[StepRecord]) -> bool:
    """Whether a rank's records say it ran on the CPU alone: its memory was read
    as the process's RSS (``StepMemory.source`` ``rss``: no CUDA allocator on its
    device), so no NCCL (a GPU-only backend) and no GPU stream to wait on; False
    when no record says (the host caveat is then kept)."""
    sources = {rec.mem.source for rec in recs if rec.mem is not None}
    return sources == {"rss"}


@dataclass(frozen=True)
class PartTime:
    """One part of a rank's step against the other ranks, in ms per step."""

    part: str
    own_ms: float
    others_ms: float  # the median over the other ranks
    excess_ms: float  # how much longer the rank takes in it

    @property
    def ratio(self) -> float | None:
        return self.own_ms / self.others_ms if self.others_ms > 0 else None


def noise_floor_ms(step_ms: float) -> float:
    """A wait or an excess under this is noise (``MIN_GAP_MS``, ``MIN_GAP_SHARE``)."""
    return max(MIN_GAP_MS, MIN_GAP_SHARE * step_ms)


def cause_of(parts: list[PartTime], step_ms: float,
             wait_ms: float | None = None) -> PartTime | None:
    """The part that makes a rank slow (the rule: module docstring), or None.
    ``step_ms``: the median step; ``wait_ms``: the others' wait per step for
    it, when measured on the same steps as the parts."""
    best = None
    for p in parts:
        if p.excess_ms < noise_floor_ms(step_ms):
            continue
        if wait_ms is not None and p.excess_ms < EXPLAINS * wait_ms:
            continue
        if p.others_ms > 0 and p.own_ms < MIN_RATIO * p.others_ms:
            continue
        if best is None or p.excess_ms > best.excess_ms:
            best = p
    return best


def part_phrase(p: PartTime) -> str:
    """``its data loading took 40.0 ms per step, 4.0x the others' median (260.0 µs)``
    (each duration in the unit that suits it, so a small median stays readable)."""
    took = f"its {PART_WORDS[p.part]} took {format_duration(p.own_ms * 1e3)} per step"
    if p.ratio is None:
        return f"{took}, where the others' median is 0"
    return f"{took}, {p.ratio:.1f}x the others' median ({format_duration(p.others_ms * 1e3)})"


def part_figures(p: PartTime) -> tuple[Figure, ...]:
    return (Figure(f"{p.part}_ms", p.own_ms, "ms"), Figure("others_median_ms", p.others_ms, "ms"),
            *((Figure("ratio", p.ratio, "x"),) if p.ratio is not None else ()))


def slow_rank_finding(rank: int, cause: PartTime | None, waited: str,
                      figures: tuple[Figure, ...] = (), unexplained: str = "") -> Finding:
    """The one sentence for a slow rank, with its cause (``part_phrase``, or
    ``no measured part explains it`` and ``unexplained``), how the others
    waited for it (``waited``) and what to look at."""
    why = part_phrase(cause) if cause else "no measured part explains it" + unexplained
    advice = ADVICE[_KIND.get(cause.part, "compute") if cause else None].format(r=rank)
    if cause is not None and cause.part == "cpu_contention":
        # how long the others queued too: a machine busy for every rank, or one core shared
        advice = CONTENDED_ADVICE.format(r=rank, others=format_ms(cause.others_ms))
    # rank and cause as figures: a view that tables the slow rank (the run
    # report's "who the others waited for") reads them rather than judge again
    named = (Figure("rank", rank), *((Figure("cause", cause.part),) if cause else ()))
    return Finding(WARNING, f"rank {rank} is the slow rank: {why}; {waited}",
                   (*named, *figures, *(part_figures(cause) if cause else ())), advice,
                   code=SLOW_RANK)


@dataclass
class SlowRank:
    """The verdict on one window of steps (definitions: the module docstring);
    ``finding`` says it."""

    rank: int | None
    cause: str | None
    finding: Finding
    gap_ms: float
    late_share: float
    skew_pct: float
    median_step_ms: float
    steps: int
    #: ``gpu``/``host`` -> the compared ranks whose phase times were measured so
    #: (``TIMED``); str keys and lists, so it reads back the same from JSON
    timed_by: dict[str, list[int]] = field(default_factory=dict)


#: rule 5: a rank that waits this many times the others' wait for a CPU stands out
CONTENDED_RATIO = 3.0
#: the advice for a rank slow for CPU contention, with the others' own wait
CONTENDED_ADVICE = ("find the process sharing rank {r}'s cores (top -H, its CPU affinity): pin "
                    "ranks apart or move the other work off their cores; the others waited "
                    "{others} a step for a CPU themselves: where that is large too, the "
                    "machine is busy for every rank (more work than cores), and rank {r} "
                    "only the one it hit most")
#: a slow rank whose others wait under this share of the median step is weak evidence
WEAK_SHARE = 0.10
#: a rank slow for CPU contention that waits for a CPU under this many times
#: what the others wait: the whole machine is oversubscribed (every rank waits),
#: and this rank's larger share of it is weaker than a leak
SHARED_CONTENTION = 2.0


def weak(finding: Finding) -> bool:
    """Whether a slow-rank verdict (``slow_rank_finding``'s) is weaker than a
    rank's memory creep: no measured part explains it, the others wait for it
    under ``WEAK_SHARE`` of the median step, or it waits for a CPU under
    ``SHARED_CONTENTION`` times what the others wait (a machine busy for all). A creep names its cause
    and ends in an out-of-memory error; such a slow rank costs little and may
    be the creeping rank's own side effect (with a planted 4 MiB-a-step leak,
    the others waited 1.2 ms of a 15.3 ms step for the leaking rank). Every
    view that has both orders them by this."""
    if finding.severity != WARNING or not isinstance(finding.value("rank"), int):
        return False
    if finding.value("cause") is None:
        return True
    ratio = finding.value("ratio")
    if (finding.value("cause") == "cpu_contention" and isinstance(ratio, (int, float))
            and ratio < SHARED_CONTENTION):
        return True
    wait, step = finding.value("wait_per_step_ms"), finding.value("median_step_ms")
    return isinstance(wait, (int, float)) and bool(step) and wait < WEAK_SHARE * step


def creep_leads(slow: Finding, creeping: Collection[int]) -> bool:
    """Whether a memory creep on ``creeping`` ranks is said before the slow-rank
    finding ``slow``: when that is weak (``weak``), names a creeping rank
    slow for a cause its leak can make (``LEAK_MADE_CAUSES``), or names any
    rank slow for its compute (``NEIGHBOUR_MADE_CAUSES``): the ranks that free
    what a leaking rank keeps allocate anew each step, and their compute
    differs from its for that (in the zoo's ``leak_losses_one``, rank 0, which
    frees its logits, spent 22 ms a step on a CPU against the leaking rank's
    18 ms in 2 of 4 runs, and was named slow for its forward and optimizer
    in one). Every view orders the two by this."""
    cause = slow.value("cause")
    return weak(slow) or cause in NEIGHBOUR_MADE_CAUSES or (
        slow.value("rank") in creeping and cause in LEAK_MADE_CAUSES)


def rank_list(ranks: list[int]) -> str:
    """``rank 3`` / ``ranks 0-3, 5`` (sorted first): how every view names a set of ranks."""
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def timed_words(timed_by: dict[str, list[int]], cpu_ranks: Collection[int] = ()) -> str:
    """``phase times: GPU time between CUDA events`` / ``...: host timers (with
    NCCL ...)`` / both, each with its ranks. The NCCL caveat only where a
    host-timed rank may have run NCCL: not when every one of them ran on the
    CPU (``cpu_ranks``, ``on_cpu``: a gloo CPU job's host timers see its waits)."""
    ways = [w for w in TIMED if timed_by.get(w)]
    if not ways:
        return ""
    gpu_host = [r for r in timed_by.get("host", []) if r not in cpu_ranks]
    caveat = f" ({HOST_CAVEAT})" if "host" in ways and gpu_host else ""
    if len(ways) == 1:
        return f"phase times: {TIMED[ways[0]]}{caveat}"
    return "phase times: " + ", ".join(
        f"{TIMED[w]} on {rank_list(timed_by[w])}" for w in ways) + caveat


def _times(rec: StepRecord, gpu: GpuStepTimes | None = None) -> dict[str, float]:
    """Step, phases (unmeasured as 0) and other, in ms: the GPU's when given."""
    step, values, other = record_ms(rec) if gpu is None else gpu_ms(gpu)
    out = {p: v or 0.0 for p, v in zip(PHASES, values, strict=True)}
    if gpu is not None:  # host work the GPU timer does not bracket: the host's figure
        for p in ("save", "eval"):
            host = 1e3 * (rec.phases.get(p) or 0.0)
            out[p] = taken = min(host, other)
            other -= taken
    out["step"], out["other"] = step, other
    # host time inside the phases: garbage collection, waiting for a CPU (0: not measured)
    host = rec.host if isinstance(rec.host, HostStep) else None
    out["gc"] = 1e3 * (host.gc_s or 0.0) if host is not None else 0.0
    out["runq"] = 1e3 * (host.runq_s or 0.0) if host is not None else 0.0
    out["cpu"] = 1e3 * (host.cpu_s or 0.0) if host is not None else 0.0
    out["recompile"] = recompile_ms(rec)
    return out


@dataclass(frozen=True)
class Late:
    """The rank late most often in a window (``_late``)."""

    rank: int
    last: int  # steps it was late in
    steps: int
    ranks: int  # ranks compared
    gaps: list[float]  # per step, the others' wait for it (ms)
    #: the steps some rank was late in (not a tie under ``TIE_MS``): the tests' sample
    decided: list[int] = field(default_factory=list)
    #: per step, the median wait (sync) of the other ranks (ms)
    others: list[float] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.last / self.steps

    @property
    def gap(self) -> float:
        return median(self.gaps)

    def chance(self) -> float:
        """P(late in this many steps or more) if every rank were equally likely."""
        return binomial_tail(self.last, len(self.decided), 1.0 / self.ranks)

    def beyond_doubt(self) -> bool:
        """Arriving last so often that chance is ruled out by itself (``ORDER_P``)."""
        return bool(self.decided) and self.chance() < ORDER_P / self.ranks

    def significant(self) -> bool:
        """Tests 1 and 3 of the module docstring (late more often than chance,
        a wait large against its own spread), over the steps someone was late
        in: a step the ranks end together tells nothing."""
        gaps = [self.gaps[i] for i in self.decided]
        if not gaps:
            return False
        if self.beyond_doubt():
            return True
        spread = robust_spread([self.others[i] for i in self.decided])
        if median(gaps) < DISPERSION * spread:
            return False
        if self.chance() < STANDOUT_P / self.ranks:
            return True
        # few steps, where no count is unlikely enough: late in nearly every one
        # of at least FEW_STEPS, by a wait far above the others' spread
        return (len(gaps) >= FEW_STEPS and self.last >= FEW_SHARE * len(gaps)
                and median(gaps) >= FEW_DISPERSION * spread)


def _late(times: dict[int, list[dict[str, float]]], sync: tuple[str, ...]) -> Late:
    """The rank late most often, how often, and the others' wait for it per step."""
    ranks = sorted(times)
    n = len(times[ranks[0]])
    waits = {r: [sum(x[p] for p in sync) for x in times[r]] for r in ranks}
    late: Counter[int] = Counter()
    decided = []
    for i in range(n):
        first = min(ranks, key=lambda r: waits[r][i])
        if median(waits[q][i] for q in ranks if q != first) - waits[first][i] > TIE_MS:
            late[first] += 1
            decided.append(i)
    rank = min(ranks, key=lambda r: (-late[r], r))
    others = [median(waits[q][i] for q in ranks if q != rank) for i in range(n)]
    gaps = [others[i] - waits[rank][i] for i in range(n)]
    return Late(rank, late[rank], n, len(ranks), gaps, decided, others)


def not_significant(late: Late) -> str:
    """``rank 2 arrived last in 10 of 20 steps (5 expected by chance), the others
    waiting 1.5 ms per step, their own wait ± 7.4 ms: not significant``."""
    return (f"rank {late.rank} arrived last in {late.last} of {late.steps} steps "
            f"({late.steps / late.ranks:.0f} expected by chance), the others waiting "
            f"{format_ms(late.gap)} per step, their own wait ± "
            f"{format_ms(robust_spread(late.others))}: not significant")


def _part(times: dict[int, list[dict[str, float]]], rank: int, part: str,
          over: Callable[[Iterable[float]], float] = median) -> PartTime:
    """``part`` of ``rank`` against the others, per step: the median over the
    window (``over``: the mean, for a part that comes in bursts)."""
    get = _PARTS[part]
    others = [q for q in times if q != rank]
    steps = range(len(times[rank]))
    theirs = [median(get(times[q][i]) for q in others) for i in steps]
    return PartTime(part, over(get(x) for x in times[rank]), over(theirs),
                    over(get(times[rank][i]) - theirs[i] for i in steps))


def _cause(times: dict[int, list[dict[str, float]]], rank: int, gap: float, step_ms: float,
           parts: tuple[str, ...]) -> tuple[PartTime | None, list[PartTime]]:
    measured = [_part(times, rank, p) for p in parts]
    cause = cause_of(measured, step_ms, gap)
    if cause is not None and cause.part == "compute":
        shares = [_part(times, rank, p) for p in COMPUTE_SHARES]
        top = max(shares, key=lambda p: p.excess_ms)
        # forward + optimizer keep compute's own figures and words; so does other on a
        # rank whose forward no timer saw (no DDP or FSDP): there other is its compute
        if top.part != "forward" and (top.part != "stall" or shares[0].own_ms > 0):
            cause = top
        # measured inside the phases, and bursty (a full collection every few
        # steps): on average over the window, against compute's average excess
        compute = _part(times, rank, "compute", mean)
        # a rank with more work waits longer for a CPU on a busy machine (a long
        # run queues behind the others' short bursts): when its own time on a CPU
        # explains the excess, the cause is its compute, not contention
        more_work = _part(times, rank, "cpu", mean).excess_ms >= EXPLAINS * compute.excess_ms
        for part in (*HOST_CAUSES, "recompile"):
            if part == "cpu_contention" and more_work:
                continue
            host = _part(times, rank, part, mean)
            if host.excess_ms >= EXPLAINS * compute.excess_ms and host.excess_ms >= MIN_GAP_MS:
                cause = host
                break
    return cause, measured


def _contended(times: dict[int, list[dict[str, float]]], rank: int, gap: float,
               step_ms: float) -> PartTime | None:
    """``rank``'s wait for a CPU as the cause the run queue measures directly
    (rule 5 of the module docstring), or None."""
    host = _part(times, rank, "cpu_contention", mean)
    if host.excess_ms < max(noise_floor_ms(step_ms), EXPLAINS * gap):
        return None
    if host.own_ms < CONTENDED_RATIO * host.others_ms:
        return None
    # more work of its own queues longer on a busy machine: then it is not contention
    if _part(times, rank, "cpu", mean).excess_ms >= EXPLAINS * host.excess_ms:
        return None
    return host


def _nobody(words: str, steps: int = 0, timed_by: dict[str, list[int]] | None = None,
            cpu_ranks: Collection[int] = (), **figures: float) -> SlowRank:
    severity = PASSED if steps else NA
    mid, skew = figures.get("median_step_ms", 0.0), figures.get("skew_pct", 0.0)
    shown = (Figure("median_step_ms", mid, "ms"), Figure("skew_pct", skew, "%"),
             Figure("steps_compared", steps)) if steps else ()
    how = timed_words(timed_by or {}, cpu_ranks) if steps else ""
    return SlowRank(None, None, Finding(severity, f"no slow rank: {words}"
                                        + (f"; {how}" if how else ""), shown, code=SLOW_RANK),
                    figures.get("gap_ms", 0.0), figures.get("late_share", 0.0), skew, mid, steps,
                    dict(timed_by or {}))


def compared_words(n: int, common: int) -> str:
    """``12 of 12 steps`` -> ``of 12 steps``; a window that left steps out:
    ``of the last 20 steps``."""
    return f"of the last {n} steps" if common > n else f"of {n} steps"


def _stalled(times: dict[int, list[dict[str, float]]], tail: list[int], every: int,
             timed_by: dict[str, list[int]], cpu_ranks: Collection[int] = ()) -> SlowRank | None:
    """The stalling rank (``analysis.ranks.stalls``) of the steps ``tail``
    (``times``: each rank's, in their order) as a slow-rank verdict, or None."""
    per_rank = [median(x["step"] for x in t) for t in times.values()]
    mid = median(per_rank)
    st = stalling_rank(times, tail, mid)
    if st is None:
        return None
    finding = stall_finding(st, mid, compared_words(len(tail), every),
                            timed_words(timed_by, cpu_ranks))
    skew = (max(per_rank) - mid) / mid * 100 if mid > 0 else 0.0
    return SlowRank(st.rank, st.cause, finding, st.wait_per_step_ms,
                    len(st.stalls) / len(tail), skew, mid, len(tail), timed_by)


def slow_rank(steps: Steps, window: int | None = WINDOW, *, second_look: bool = False
              ) -> SlowRank:
    """The rank the others wait for in the last ``window`` common steps (all
    of them when ``window`` is None), and why. Every view calls it with the
    default (module docstring). ``second_look``: the longer window's test
    only (order beyond doubt), no stall rule, an empty answer when none."""
    by_rank = {r: d for r, recs in enumerate(steps)
               if (d := {rec.step: rec for rec in recs if not rec.labelled})}
    if len(steps) < 2:
        return _nobody("one rank, nothing to compare")
    if len(by_rank) < 2:
        return _nobody("only one rank has reported steps" if by_rank
                       else "no rank has reported a step")
    on_gpu = {r: gpu_steps(steps[r]) for r in by_rank}
    timed_by = {w: [r for r in by_rank if bool(on_gpu[r]) == (w == "gpu")] for w in TIMED}
    cpu_ranks = {r for r in by_rank if on_cpu(steps[r])}
    # a rank timed on its GPU compares the steps whose GPU times have come
    have = [{s for s, rec in d.items() if (rec.start, s) in on_gpu[r]} if on_gpu[r] else set(d)
            for r, d in by_rank.items()]
    common = every_step = sorted(set.intersection(*have))
    every = len(common)
    common = common[-window:] if window else common
    if not common:
        return _nobody("no step has ended on every rank yet"
                       + (" (GPU times come a step or more after the step)"
                          if timed_by["gpu"] else ""))
    times = {r: [_times(d[s], on_gpu[r].get((d[s].start, s))) for s in common]
             for r, d in by_rank.items()}
    per_rank = [median(x["step"] for x in t) for t in times.values()]
    mid = median(per_rank)
    figures = {"median_step_ms": mid,
               "skew_pct": (max(per_rank) - mid) / mid * 100 if mid > 0 else 0.0}
    n = len(common)

    def stands_out(late: Late) -> bool:
        return (late.share >= MIN_LATE_SHARE and late.gap >= noise_floor_ms(mid)
                and (late.beyond_doubt() if second_look else late.significant()))

    late = _late(times, ("backward", "collective"))
    cause, measured = _cause(times, late.rank, late.gap, mid, ("data", "compute"))
    found = stands_out(late) and (cause is not None or late.share >= UNEXPLAINED_SHARE)
    if (cause is None or not found) and late.share >= MIN_LATE_SHARE \
            and late.gap >= noise_floor_ms(mid):
        contended = _contended(times, late.rank, late.gap, mid)
        if contended is not None:  # rule 5: the run queue is the evidence
            found, cause = True, contended
            measured = [*measured, contended]
    if not found and any(x["backward"] > 0 for t in times.values() for x in t):
        late2 = _late(times, ("backward",))
        c2, _ = _cause(times, late2.rank, late2.gap, mid, ("data", "compute", "collective"))
        # a second hypothesis after the first found nothing: its order must be
        # beyond doubt (a Lightning job at load 4 was last in 16 of 20 by chance)
        if (stands_out(late2) and late2.beyond_doubt() and c2 is not None
                and c2.part == "collective"):
            found, late, cause = True, late2, c2
    rank, share, gap = late.rank, late.share, late.gap
    if not found and second_look:
        return _nobody("", n)
    if not found and window == WINDOW and every > n:
        longer = slow_rank(steps, LONG_WINDOW, second_look=True)
        if longer.rank is not None:
            return longer
    if not found:
        tail = every_step[-STALL_WINDOW:] if window else every_step
        # the stall rule's longer window: the steps timed already are reused
        known = {r: dict(zip(common, times[r], strict=True)) for r in by_rank}
        held = {r: [known[r].get(s) or _times(d[s], on_gpu[r].get((d[s].start, s)))
                    for s in tail] for r, d in by_rank.items()}
        recompiled = recompiling_rank(held, tail, by_rank, mid)
        if recompiled is not None:  # a stall whose cause torch recorded
            return SlowRank(recompiled.rank, "recompile", recompile_finding(
                recompiled, mid, compared_words(len(tail), every),
                timed_words(timed_by, cpu_ranks)), recompiled.wait_per_step_ms,
                len(recompiled.steps) / len(tail), figures["skew_pct"], mid, len(tail),
                timed_by)
        stalled = _stalled(held, tail, every, timed_by, cpu_ranks)
        if stalled is not None:
            return stalled
        # the ranks' medians against each other, as the rank table beside it shows them
        low = min(per_rank)
        spread = (max(per_rank) - low) / low * 100 if low > 0 else 0.0
        words = (f"step times within {format_percent(max(1, spread))} of each other "
                 f"(median {format_ms(mid)}" + (f" over the last {n} steps)" if every > n else ")"))
        if gap >= noise_floor_ms(mid):
            words += ("; the rank the others wait for changes from step to step"
                      if share < MIN_LATE_SHARE else f"; {not_significant(late)}")
        return _nobody(words, n, timed_by, cpu_ranks, gap_ms=gap, late_share=share, **figures)
    last = late.last
    excess = ", ".join(f"{p.part} {format_ms(p.excess_ms, signed=True)}" for p in measured)
    finding = slow_rank_finding(
        rank, cause, f"the others waited {format_ms(gap)} per step for it (last in {last} "
        f"{compared_words(n, every)}); {timed_words(timed_by, cpu_ranks)}",
        (Figure("wait_per_step_ms", gap, "ms"), Figure("steps_arrived_last", last),
         Figure("steps_compared", n), Figure("median_step_ms", mid, "ms"),
         Figure("skew_pct", figures["skew_pct"], "%"),
         # only where a rank is: "ranks timed on gpu 0" on a CPU job read as a fault
         *((Figure("ranks_timed_on_gpu", len(timed_by["gpu"])),) if timed_by["gpu"] else ())),
        f" ({excess} per step against the others' median)")
    return SlowRank(rank, cause.part if cause else None, finding, gap, share,
                    figures["skew_pct"], mid, n, timed_by)
