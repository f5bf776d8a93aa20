"""The findings about the whole job that lead "no slow rank": every rank alike.

``job_wide`` is the one way in for every view (the collector's verdict, the
run folder's, the report's): the input-bound rule first, then DDP's gradient
synchronisation (``analysis.ranks.ddp_config``), then a graph break that
every rank's compiled step meets.

A graph break in the step: ``torch.compile`` splits the compiled code there
and runs the line between eagerly on every step. The rank records what it
compiled (``StepRecord.compiled``) and, once in 50 steps, everything it
compiled so far (``compiled_so_far``), so the breaks dynamo met at the first
steps are in every window judged. Breaks inside torch's or Python's own code
(DDP's forward wrapper calls functions dynamo skips) are left out: the user
cannot move them, and every compiled DDP job has them.

Skipped optimizer steps (``StepRecord.scaler``; the rule and its words:
``analysis.scaler``): a window of steps with ``MIN_SKIPS`` (2) or more skips
on a rank is an overflow that keeps coming back. Under DDP the ranks average their gradients before the
scaler looks, so an inf on one rank skips the step on every rank: the
records cannot tell which rank's batch overflowed.
"""

from __future__ import annotations

from torchlens.analysis.ranks.ddp_config import ddp_config, rank_words
from torchlens.analysis.ranks.input_bound import input_bound
from torchlens.analysis.ranks.stalls import STALL_WINDOW
from torchlens.analysis.scaler import MIN_SKIPS, collapsed, skipped_finding
from torchlens.analysis.trace.compiled import (
    GraphBreak,
    graph_breaks,
    user_code,
)
from torchlens.model.compiled import CompileLog, merged
from torchlens.model.findings import (
    GRAPH_BREAK,
    WARNING,
    Figure,
    Finding,
)
from torchlens.model.records import ScalerStep, StepRecord
from torchlens.model.units import plural


def job_wide(steps: list[list[StepRecord]]) -> Finding | None:
    """The first job-wide finding that applies (module docstring), or None."""
    return (input_bound(steps) or ddp_config(steps) or skipped_steps(steps)
            or step_graph_breaks(steps))


def compiled_of(records: list[StepRecord]) -> CompileLog | None:
    """What a rank compiled, as its records tell: the newest ``compiled_so_far``
    with the steps' own compiles after it, else its steps' compiles merged."""
    total: CompileLog | None = None
    newest = -1
    for i, rec in enumerate(records):
        if isinstance(rec.compiled_so_far, CompileLog):
            total, newest = rec.compiled_so_far, i
    for rec in records[newest + 1:]:
        if isinstance(rec.compiled, CompileLog):
            total = merged(total, rec.compiled)
    return total


def step_graph_breaks(steps: list[list[StepRecord]]) -> Finding | None:
    """A graph break in user code that every compiling rank met (the first by
    count), said once for the job; None when no rank compiled or none broke."""
    by_rank: dict[int, list[GraphBreak]] = {}
    compiling = []
    for r, records in enumerate(steps):
        log = compiled_of(records)
        if log is None or not log.frames:
            continue
        compiling.append(r)
        mine = [b for b in graph_breaks(log) if b.where and user_code(b.file)]
        if mine:
            by_rank[r] = mine
    if not by_rank:
        return None
    first = by_rank[min(by_rank)][0]
    ranks = sorted(by_rank)
    who = ("every rank's" if ranks == compiling and len(ranks) > 1
           else f"{rank_words(ranks)}'s")
    more = sum(len(b) for b in by_rank.values()) // len(by_rank) - 1
    also = f" ({plural(more, 'other break')} too)" if more > 0 else ""
    return Finding(
        WARNING, f"{who} compiled step breaks its graph in {first.function} at {first.where}"
        f"{also}: {first.reason}; the code between the compiled pieces runs eagerly every "
        "step", (Figure("where", first.where), Figure("function", first.function),
                 Figure("rank_count", len(ranks)), Figure("breaks", more + 1)),
        first.hint or "move the line out of the compiled function, or make it traceable; "
        "torch._dynamo.explain(fn)(*args) lists every break",
        "graph break in the step", details={"ranks": ranks}, code=GRAPH_BREAK)


def skipped_steps(steps: list[list[StepRecord]]) -> Finding | None:
    """Ranks whose loss scaler skipped ``MIN_SKIPS`` or more optimizer steps in
    the records given (the window judged), or None."""
    rows = []
    for r, records in enumerate(steps):
        # the last STALL_WINDOW records: the same steps whichever view judges
        # (the collector keeps 64 a rank, a run folder all of them)
        scaled = [rec.scaler for rec in records[-STALL_WINDOW:]
                  if isinstance(rec.scaler, ScalerStep)]
        skipped, taken = sum(s.skipped for s in scaled), sum(s.steps for s in scaled)
        if skipped >= MIN_SKIPS:
            rows.append((r, skipped, taken, scaled[-1]))
    scaling = [r for r, records in enumerate(steps)
               if any(isinstance(rec.scaler, ScalerStep) for rec in records)]
    lasts = {r: next(rec.scaler for rec in reversed(steps[r])
                     if isinstance(rec.scaler, ScalerStep)) for r in scaling}
    whole_run = False
    if not rows:
        # no overflow in the window, but a scale that fell below 1 over the run
        fallen = [r for r in scaling if collapsed(lasts[r])]
        if not fallen:
            return None
        rows = [(r, lasts[r].total_skipped, lasts[r].total_steps, lasts[r]) for r in fallen]
        whole_run = True
    _, skipped, taken, last = rows[0]
    ranks = [r for r, *_ in rows]
    # under DDP a skip is every rank's (one averaged gradient): a rank a few steps
    # behind may hold one skip fewer in its window, and is skipping all the same
    if len(scaling) > 1 and all(lasts[r].total_skipped > 0 for r in scaling):
        ranks = scaling
    who = "on every rank" if ranks == scaling and len(ranks) > 1 else f"on {rank_words(ranks)}"
    shared = (" (DDP averages the gradients first: an inf on one rank skips the step on "
              "all, so which rank's batch overflowed is not known)"
              if len(ranks) > 1 else "")
    words = f"the run's {taken:,}" if whole_run else f"the last {taken}"
    return skipped_finding(skipped, taken, last, steps_words=words, who=who,
                           shared=shared, ranks=ranks)
