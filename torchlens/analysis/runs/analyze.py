"""``analyze(profile)`` of a ``run`` Profile: every table of the run, computed once.

The kinds registry calls it for the report, the text view and ``repr``; the
result object (``frontends.runs.api.RunResult``) hands its tables out as
DataFrames and ``--json``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from torchlens.analysis.runs import causes as why
from torchlens.analysis.runs import clock, slow_ranks, tables
from torchlens.analysis.runs import collectives as colls
from torchlens.analysis.runs import launch_tables as run_launches
from torchlens.analysis.runs.fsdp import fsdp_rows
from torchlens.analysis.runs.rows import (
    ClockRow,
    CollectiveOverlapRow,
    CollectiveRow,
    FsdpRow,
    IdleRow,
    KernelRow,
    LaunchKernelRow,
    LaunchOutlierRow,
    LaunchRow,
    MemoryBwRow,
    OverlapRow,
    QueueRow,
    StepRow,
    StepSkewRow,
    StragglerRow,
    TemporalRow,
    TopKernelRow,
)
from torchlens.formats.run_folder.files import MANIFEST
from torchlens.model import Profile
from torchlens.model.findings import (
    IGNORED_FILES,
    INFO,
    SLOW_RANK,
    WARNING,
    Figure,
    Finding,
)
from torchlens.model.run_figures import Problem
from torchlens.model.units import format_percent, format_us_as_ms

#: under every view of the temporal breakdown: a user holding HTA's figures
#: beside ours sees different last digits on an ns-resolution trace, and why
NS_NOTE = ("times as the trace recorded them, to the nanosecond; HTA rounds an "
           "ns-resolution trace down to whole µs unless HTA_DISABLE_NS_ROUNDING=1, "
           "so its figures can differ in the last digits")


#: what a view says in place of the per-rank GPU time table when no rank's
#: traces hold a GPU event (every figure of it would be "n/a")
NO_GPU_TIMELINE = ("GPU time per rank: not measured: no rank's traces hold GPU events "
                   "(a CPU job, e.g. gloo on the CPU: the traces have no device trace), so "
                   "there is no GPU timeline to break down")


def temporal_unmeasured(temporal: list[TemporalRow]) -> str | None:
    """``NO_GPU_TIMELINE`` when no rank's row holds a measured figure (no rank's
    traces hold GPU events), else None: the table has something to show."""
    if any(r.gpu or r.span_us is not None for r in temporal):
        return None
    return NO_GPU_TIMELINE


#: findings that never lead as a verdict: what was not read, not what was found
NOT_A_VERDICT = (IGNORED_FILES,)


@dataclass
class RunAnalysis:
    """The run's tables (lists of rows, ``rows.py``) and its findings in words."""

    ranks: list[int]
    world_size: int | None
    problems: list[Problem]
    temporal: list[TemporalRow]
    idle: list[IdleRow]
    overlap: list[OverlapRow]
    kernels: list[KernelRow]
    top_kernels: list[TopKernelRow]
    steps: list[StepRow]
    step_skew: list[StepSkewRow]
    collectives: list[CollectiveRow] = field(default_factory=list)
    stragglers: list[StragglerRow] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def verdict(self) -> Finding | None:
        """The finding that leads as the run's verdict: the first, unless it only
        says which files were not read (nothing was judged then)."""
        first = self.findings[0] if self.findings else None
        return None if first is None or first.code in NOT_A_VERDICT else first
    clocks: list[ClockRow] = field(default_factory=list)
    launches: list[LaunchRow] = field(default_factory=list)
    launch_outliers: list[LaunchOutlierRow] = field(default_factory=list)
    launch_kernels: list[LaunchKernelRow] = field(default_factory=list)
    queues: list[QueueRow] = field(default_factory=list)
    memory_bw: list[MemoryBwRow] = field(default_factory=list)
    collective_overlap: list[CollectiveOverlapRow] = field(default_factory=list)
    #: FSDP ranks' parameter and optimizer memory (``fsdp.fsdp_rows``); empty without FSDP
    fsdp: list[FsdpRow] = field(default_factory=list)
    #: table name (``stragglers``, ``step_skew``) -> what it is evidence for and
    #: over which window (``evidence``): said under the table
    evidence: dict[str, str] = field(default_factory=dict)


def evidence(a: RunAnalysis, judged: Finding | None) -> dict[str, str]:
    """What the stragglers and step-skew tables are evidence for, and their
    window: the slow rank has one verdict, the run folder's step records'
    (``judged``, ``analysis.ranks.slow``) when it has them, else the
    collective-arrival test's (``slow_ranks.findings``); these tables show what
    it rests on, never a second verdict."""
    profiled = len({row.step for row in a.steps})
    window = (f"the {profiled} profiled step(s) in the traces" if profiled
              else "the collectives in the traces")
    named = judged.value("rank") if judged is not None else None
    steps = judged.value("steps_compared") if judged is not None else None
    stalls = judged.value("stalls") if judged is not None else None
    per = "per stall and per step" if stalls else "per step"
    over = f" over {steps} steps" if steps else ""
    if judged is None:
        said = ("the slow-rank test (a rank that arrived last far more often than chance, "
                f"with at least 1 ms of others' wait, is a finding above), over {window}")
    elif isinstance(named, int):
        said = (f"evidence for the verdict above (rank {named}, judged from the step "
                f"records{over}); arrivals over {window}; rank {named}'s wait is the "
                f"verdict's, {per} over its steps")
    else:
        said = (f"the verdict above names no slow rank (judged from the step "
                f"records{over}); arrivals over {window}")
    out = {"stragglers": f"Window and role: {said}."}
    if a.step_skew:
        out["step_skew"] = (
            f"Window and role: {window}, each rank's wall time per step; it includes the "
            "rank's waits for the others, so the longest is not the slow rank: "
            + ("the verdict above names it." if isinstance(named, int)
               else "the findings above say whether one stands out."))
    return out


def figures_by_rank(profile: Profile) -> tables.RankFigures:
    return {int(r): f for r, f in profile.payload.figures.items()}  # type: ignore[union-attr]


def findings(a: RunAnalysis, ranks: tables.RankFigures, judged: bool = False) -> list[Finding]:
    """What the run shows, most telling first.

    - unless the run folder's step records ``judged`` the slow rank already
      (its verdict leads the findings: one verdict, one set of figures), the
      ranks that arrived last at collectives far more often than chance,
      with the part of their step breakdown that stands out (``causes``),
      and collective sequences that disagree (``slow_ranks.findings``);
    - clocks that had to be aligned (``clock.findings``);
    - the rank with the most idle GPU time, when it idles at least 10 points
      more than the median rank;
    - the largest step-time skew, when a step's slowest rank took at least 5%
      longer than the median (unless the step records judged the run);
    - communication that compute barely hides (median overlap under 20%, over
      the ranks with compute and at least 10% non-compute time);
    - all_gather time that compute did not hide (``exposed_all_gather``);
    - what could not be read.
    """
    causes = {s.rank: part for s in a.stragglers if (part := why.cause_part(s))}
    steps: dict[int, int] = {}
    for row in a.steps:
        steps[row.rank] = steps.get(row.rank, 0) + 1
    out: list[Finding] = slow_ranks.findings(ranks, a.world_size, rows=a.collectives, causes=causes,
                                             steps=steps, name_ranks=not judged)
    out += clock.findings(a.clocks)
    gpu = [(r.rank, r.idle_pct) for r in a.temporal if r.idle_pct is not None]
    if len(gpu) >= 2:
        ordered = sorted(idle for _, idle in gpu)
        median = ordered[len(ordered) // 2]
        worst, idle = max(gpu, key=lambda r: r[1])
        if idle - median >= 10:
            out.append(Finding(
                WARNING, f"rank {worst}'s GPU was idle {format_percent(idle)} of "
                f"its timeline, against {format_percent(median)} for the median rank",
                (Figure("idle_pct", idle, "%"),
                 Figure("median_idle_pct", median, "%")), code="idle_rank"))
    # a run folder's verdict judged the ranks' step times over every recorded
    # step: one profiled step's skew (where, in DDP, each rank's wall time
    # includes its wait for the others) would name another rank
    if a.step_skew and not judged:
        worst_step = max(a.step_skew, key=lambda r: r.skew_pct or 0)
        if (worst_step.skew_pct or 0) >= 5:
            out.append(Finding(
                WARNING, f"step {worst_step.step}: rank {worst_step.longest_rank} took "
                f"{format_us_as_ms(worst_step.max_us)}, "
                f"{format_percent(worst_step.skew_pct)} longer than the median rank "
                f"({format_us_as_ms(worst_step.median_us)})",
                (Figure("max_us", worst_step.max_us, "µs"),
                 Figure("median_us", worst_step.median_us, "µs"),
                 Figure("skew_pct", worst_step.skew_pct, "%")), code="step_skew"))
    # only where there is compute that could hide it and communication worth hiding
    busy = {r.rank for r in a.temporal
            if (r.compute_us or 0) > 0 and (r.non_compute_pct or 0) >= 10}
    overlaps = sorted(r.overlap_pct for r in a.overlap
                      if r.overlap_pct is not None and r.rank in busy)
    if overlaps and overlaps[len(overlaps) // 2] < 20:
        out.append(Finding(
            INFO, f"compute hides little of the communication: median overlap "
            f"{format_percent(overlaps[len(overlaps) // 2])} of communication time",
            (Figure("overlap_pct", overlaps[len(overlaps) // 2], "%"),), code="low_overlap"))
    out += exposed_all_gather(a.collective_overlap)
    return out + problem_findings(a.problems)


def problem_findings(problems: list[Problem]) -> list[Finding]:
    """The inputs that could not be used: a damaged manifest in its own words
    (it is no rank: what it held is what is lost, ``frontends.runs.
    damaged_files``), then how many other problems there were."""
    lost = [p for p in problems if _manifest_lost(p)]
    out = [Finding(WARNING, p.message.rstrip("."), code="manifest_lost") for p in lost]
    rest = [p for p in problems if p not in lost]
    if rest:
        kinds = sorted({p.kind for p in rest})
        out.append(Finding(
            WARNING, f"{len(rest)} input problem(s) ({', '.join(kinds)}), each named on its "
            "own line with its file; what could be read was analysed",
            (Figure("problems", len(rest)),),
            code="input_problems"))
    return out


def _manifest_lost(p: Problem) -> bool:
    return p.kind in ("unreadable", "missing") and os.path.basename(p.path) == MANIFEST


def unsaid_problems(problems: list[Problem]) -> list[Problem]:
    """The problems no finding says in full, for a view's list of problems: a
    damaged manifest's sentence is its own finding (``problem_findings``), so
    a view that lists the findings says it once, there."""
    return [p for p in problems if not _manifest_lost(p)]


#: exposed all_gather time, as a share of a rank's GPU timeline, worth a finding
EXPOSED_ALL_GATHER_PCT = 10.0


def exposed_all_gather(rows: list[CollectiveOverlapRow]) -> list[Finding]:
    """The rank whose all_gathers compute hid least, when their exposed time is
    at least ``EXPOSED_ALL_GATHER_PCT`` of its GPU timeline
    (``tables.collective_overlap_rows``): in FSDP that is the parameter
    prefetch that failed to hide, the GPU waiting for parameters."""
    gathers = [r for r in rows if r.collective == "all_gather"
               and (r.exposed_pct or 0) >= EXPOSED_ALL_GATHER_PCT]
    if not gathers:
        return []
    worst = max(gathers, key=lambda r: r.exposed_pct or 0)
    others = f" ({len(gathers) - 1} other rank(s) over {EXPOSED_ALL_GATHER_PCT:.0f}% too)" \
        if len(gathers) > 1 else ""
    return [Finding(
        WARNING, f"rank {worst.rank}: {format_us_as_ms(worst.exposed_us)} of all_gather "
        f"not hidden by compute (exposed), {format_percent(worst.exposed_pct)} of its GPU "
        f"timeline; compute overlapped {format_percent(worst.overlap_pct)} of its "
        f"{format_us_as_ms(worst.communication_us)} of all_gather{others}",
        (Figure("exposed_us", worst.exposed_us, "µs"),
         Figure("exposed_pct", worst.exposed_pct, "%"),
         Figure("overlap_pct", worst.overlap_pct, "%")),
        advice="with FSDP, this is parameter prefetch that did not hide: see "
               "docs/integrations/fsdp.md, \"Reading the overlap\"",
        title="exposed all_gather")]


def analyze(profile: Profile) -> RunAnalysis:
    ranks = figures_by_rank(profile)
    payload = profile.payload
    a = RunAnalysis(ranks=sorted(ranks), world_size=payload.world_size,  # type: ignore[union-attr]
                    problems=list(payload.problems),  # type: ignore[union-attr]
                    temporal=tables.temporal_rows(ranks), idle=tables.idle_rows(ranks),
                    overlap=tables.overlap_rows(ranks), kernels=tables.kernel_rows(ranks),
                    top_kernels=tables.top_kernel_rows(ranks), steps=tables.step_rows(ranks),
                    step_skew=tables.step_skew_rows(ranks))
    a.collective_overlap = tables.collective_overlap_rows(ranks)
    a.fsdp = fsdp_rows(getattr(payload, "fsdp", None) or {})
    a.collectives = colls.collective_rows(ranks, a.world_size)
    # stragglers and findings read arrivals on aligned clocks (clock's docstring)
    a.clocks = clock.clock_rows(ranks, a.collectives)
    a.collectives = clock.align_rows(a.collectives, a.clocks)
    a.stragglers = why.with_causes(
        slow_ranks.straggler_rows(ranks, a.world_size, rows=a.collectives), a.steps)
    a.launches = run_launches.launch_rows(ranks)
    a.launch_outliers = run_launches.launch_outlier_rows(ranks)
    a.launch_kernels = run_launches.launch_kernel_rows(ranks)
    a.queues = run_launches.queue_rows(ranks)
    a.memory_bw = run_launches.memory_bw_rows(ranks)
    # what stopped the run, the slow-rank verdict of the folder's step
    # records and the collector's notes lead (``verdict.leading_findings``)
    notes = list(getattr(payload, "notes", None) or [])
    verdict = next((f for f in notes if f.code == SLOW_RANK), None)
    if verdict is not None:
        a.stragglers = why.with_verdict(a.stragglers, verdict)
    a.findings = notes + findings(a, ranks, verdict is not None)
    a.evidence = evidence(a, verdict)
    return a
