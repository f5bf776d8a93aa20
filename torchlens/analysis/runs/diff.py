"""The diff of two runs (or two traces): ops and kernels added, removed, slower
and faster per step, and the step time (``torchlens diff A B``, ``run.diff(other)``).

Inputs are two runs' figures, ``{rank: [figures of each trace]}`` as
``frontends.runs.api`` keeps them: each trace's ``op_totals``
(``op_totals.op_totals``: per kind and name, count and µs inside the
``ProfilerStep#N`` spans) and ``steps`` (the ``%%torchprof`` step breakdown).

Definitions (every time in µs):

- Units of a run: the sum over its traces of their ``ProfilerStep#N`` spans;
  a trace without any counts as one unit (its totals are the whole trace's),
  so per-step figures become per-trace figures there (``per`` says which).
- Per kind (``cpu_op``, ``user_annotation``, ``kernel``, ``gpu_memcpy``,
  ``gpu_memset``) and name: ``a_us`` / ``b_us`` = the name's total time over
  every trace of every rank divided by the run's units: the mean time per
  step and rank; ``a_calls`` / ``b_calls`` likewise for the count.
  ``delta_us`` = b - a; ``delta_pct`` = 100 * delta / a (``None`` when a is 0).
- ``status``: ``added`` (no call in A, some in B), ``removed`` (the reverse),
  ``same`` when the change is within ``same_pct`` (5%) of A's time,
  ``small`` when it is beyond that but within ``same_us`` (10 µs) per step
  (20 -> 12 µs is -40% yet too little time to matter: it must not read
  "same"), else ``slower`` or ``faster``: a change must exceed both to count.
  Each trace keeps its top names per kind (``op_totals.TOP_NAMES``); the
  rest are one row per kind named ``REST``.
- Step time (``source``): when both runs have step records (a run folder of
  ``torchlens run`` or ``%ddp_check --profile``: every ``torchlens.step()``
  of every rank, ``t1 - t0``), the median over all of them: ``step
  records``. The profiled steps are a few, one of them often a warm-up, so
  they are used only when a run has no step records: the median ``dur_us``
  of every step of every rank and trace (the step breakdown's steps, widened
  to their GPU work): ``profiled steps``. Both runs always use the same
  source. ``regression_pct`` = 100 * (B - A) / A, positive when B is slower.
- Per rank: the median step time (same source) of each rank both runs have;
  when they share no rank but each has exactly one (two single traces, e.g.
  rank 0 of one job and rank 1 of another), those two are compared. Ranks
  only one run has are named in ``notes``.
- Verdict: the step time change; when B's step time is below A's, the
  largest speedup (the faster or removed row whose time fell most); and the
  largest slowdown (slower or added), on a faster run too, so what got
  slower is not hidden. ``small`` and ``same`` rows are never named.
"""

from __future__ import annotations

import statistics
from typing import Any

from torchlens.analysis.changes import change_status
from torchlens.analysis.runs.op_totals import GPU_KINDS, HOST_KINDS
from torchlens.model.findings import INFO, PASSED, RUN_DIFF, WARNING, Figure, Finding
from torchlens.model.payloads import (
    DiffRow,
    DiffThresholds,
    DiffUnits,
    RankSteps,
    RunDiff,
    StepTime,
)
from torchlens.model.run_figures import OpTotals, RankFigures
from torchlens.model.units import (
    format_duration,
    format_percent,
    format_us_as_ms,
    plural,
)

#: Per rank, the µs of each recorded step (``t1 - t0`` of its step records).
RecordedSteps = dict[int, list[float]]
SAME_PCT = 5.0
SAME_US = 10.0
#: The row that sums, per kind, the names outside each trace's kept top.
REST = "(other names)"
STATUSES = ("added", "removed", "slower", "faster", "small", "same")
RECORDED, PROFILED = "step records", "profiled steps"


def diff_runs(a: RankFigures, b: RankFigures, *,
              recorded: tuple[RecordedSteps | None, RecordedSteps | None] = (None, None),
              same_pct: float = SAME_PCT, same_us: float = SAME_US) -> RunDiff:
    """The diff of run ``b`` against run ``a`` (see the module docstring):
    ``ops``, ``kernels``, ``step_time``, ``rank_steps``, ``notes``, ``summary``
    (rows per status) and ``verdict`` (a ``Finding``, code ``run_diff``).
    ``recorded``: each run's step records (None: it has none)."""
    notes: list[str] = []
    sides = {}
    per_trace = False
    for label, run in (("A", a), ("B", b)):
        totals, units, traces, stepped = _totals(run)
        if traces < sum(len(v) for v in run.values()):
            notes.append(f"{label}: {sum(len(v) for v in run.values()) - traces} trace(s) "
                         "hold no op totals (saved by an older torchlens): left out")
        if traces and stepped < traces:
            notes.append(f"{label}: {traces - stepped} of {traces} trace(s) have no "
                         "ProfilerStep#N spans: their figures count per trace, not per step")
        sides[label] = (totals, units)
        per_trace |= stepped < traces or not traces
    rows = _rows(sides["A"], sides["B"], same_pct, same_us)
    ops = [r for r in rows if r.kind in HOST_KINDS]
    kernels = [r for r in rows if r.kind in GPU_KINDS]
    rec_a, rec_b = recorded
    if rec_a and rec_b:
        steps_a, steps_b, source = rec_a, rec_b, RECORDED
    else:
        steps_a, steps_b, source = _profiled(a), _profiled(b), PROFILED
        if rec_a or rec_b:
            notes.append(f"only {'A' if rec_a else 'B'} has step records: both step times "
                         "are of the profiled steps, to compare like with like")
    step_time = _step_time(steps_a, steps_b, source)
    rank_steps = _rank_steps(steps_a, steps_b, notes)
    for label, n in (("A", step_time.a_steps), ("B", step_time.b_steps)):
        if n == 0:
            notes.append(f"{label} has no ProfilerStep#N spans: no step time (mark steps "
                         "with torch.profiler's schedule and prof.step(), or torchlens.step())")
    out = RunDiff(per="trace" if per_trace else "step",
                  units=DiffUnits(sides["A"][1], sides["B"][1]),
                  thresholds=DiffThresholds(same_pct, same_us),
                  step_time=step_time, rank_steps=rank_steps,
                  summary={s: sum(r.status == s for r in rows) for s in STATUSES},
                  ops=ops, kernels=kernels, notes=notes)
    out.verdict = verdict(out, (len(a), len(b)))
    return out


def regressed(diff: RunDiff, pct: float) -> bool | None:
    """Whether B's median step time is more than ``pct`` % above A's
    (``None`` when either run has no step time)."""
    reg = diff.step_time.regression_pct
    return None if reg is None else reg > pct


def verdict(diff: RunDiff, ranks: tuple[int, int] = (1, 1)) -> Finding:
    """The step time change and its largest slowdown, and on a faster run its
    largest speedup first, in one sentence: a warning when B is more than
    ``same_pct`` slower, passed when it is not. ``ranks``: A's and B's rank
    counts; with several, a change's unit says it is a mean over the ranks,
    so it is not read against a view's per-rank figures."""
    st = diff.step_time
    figures: list[Figure] = []
    if st.regression_pct is None:
        severity = INFO
        head = "step time unknown (" + ("neither run" if not (st.a_steps or st.b_steps)
                                        else "A" if not st.a_steps else "B") \
               + " has ProfilerStep#N spans)"
    else:
        severity = WARNING if st.regression_pct > diff.thresholds.same_pct else PASSED
        which = "recorded" if st.source == RECORDED else "profiled"
        head = (f"step time {format_us_as_ms(st.a_median_us)} -> "
                f"{format_us_as_ms(st.b_median_us)} "
                f"({format_percent(st.regression_pct, signed=True)}, median of "
                f"{st.a_steps} {which} steps of A and {st.b_steps} of B)")
        figures += [Figure("a_median_us", st.a_median_us, "µs"),
                    Figure("b_median_us", st.b_median_us, "µs"),
                    Figure("regression_pct", st.regression_pct, "%")]
    per = "per step" if diff.per == "step" else "per trace"
    if diff.per == "step" and max(ranks) > 1:
        per += (f" and rank, mean of {ranks[0]} ranks" if ranks[0] == ranks[1]
                else f" and rank, mean of {plural(ranks[0], 'rank')} of A and {ranks[1]} of B")
    rows = [r for r in diff.ops + diff.kernels if r.name != REST]
    better = [r for r in rows if r.status in ("faster", "removed")]
    worse = [r for r in rows if r.status in ("slower", "added")]
    parts = []
    if _faster(diff):
        if better:
            w = min(better, key=lambda r: r.delta_us)
            parts.append(_change("largest speedup", w, per, "removed"))
            figures.append(Figure("largest_speedup_us", w.delta_us, "µs"))
        else:
            parts.append("no op or kernel got faster")
    if worse:
        # named on a faster run too: a collective that waits longer is not
        # hidden by the ops that sped up
        w = max(worse, key=lambda r: r.delta_us)
        parts.append(_change("largest slowdown", w, per, "added"))
        figures.append(Figure("largest_slowdown_us", w.delta_us, "µs"))
    elif not _faster(diff):
        parts.append("no op or kernel got slower")
    tail = "; ".join(parts)
    return Finding(severity, f"{head}; {tail}", tuple(figures), code=RUN_DIFF)


def _faster(diff: RunDiff) -> bool:
    """Whether B's step time is below A's (without a step time nothing says
    which way the run went: the verdict names its largest slowdown)."""
    reg = diff.step_time.regression_pct
    return reg is not None and reg < 0


def _change(label: str, row: DiffRow, per: str, whole: str) -> str:
    name = row.name if len(row.name) <= 80 else row.name[:77] + "..."
    return (f"{label}: {_kind_word(row.kind)} {name} "
            f"{format_duration(row.delta_us, signed=True)} {per}"
            + (f" ({whole})" if row.status == whole else ""))


# ------------------------------------------------------------------ internals
def _totals(run: RankFigures) -> tuple[dict[tuple[str, str], list[float]], int, int, int]:
    """(kind, name) -> [count, us] over the run; its units; traces with totals;
    those with steps."""
    totals: dict[tuple[str, str], list[float]] = {}
    units = traces = stepped = 0
    for rank in sorted(run):
        for figures in run[rank]:
            t = figures.op_totals
            if not isinstance(t, OpTotals):
                continue
            traces += 1
            stepped += bool(t.steps)
            units += t.steps or 1
            for kind, k in t.kinds.items():
                for name, n, us in zip(k.names, k.count, k.us, strict=True):
                    cell = totals.setdefault((kind, name), [0, 0.0])
                    cell[0] += n
                    cell[1] += us
                if k.rest:
                    cell = totals.setdefault((kind, REST), [0, 0.0])
                    cell[0] += k.rest.count
                    cell[1] += k.rest.us
    return totals, units, traces, stepped


def _rows(a: tuple[dict, int], b: tuple[dict, int], same_pct: float,
          same_us: float) -> list[DiffRow]:
    (ta, ua), (tb, ub) = a, b
    rows = []
    for key in sorted(set(ta) | set(tb)):
        ca, sa = ta.get(key, (0, 0.0))
        cb, sb = tb.get(key, (0, 0.0))
        a_us, b_us = (sa / ua if ua else 0.0), (sb / ub if ub else 0.0)
        a_calls, b_calls = (ca / ua if ua else 0.0), (cb / ub if ub else 0.0)
        delta = b_us - a_us
        pct = 100.0 * delta / a_us if a_us else None
        status = change_status(a_us, b_us, in_a=bool(ca), in_b=bool(cb), same_pct=same_pct,
                               small=same_us, up="slower", down="faster")
        rows.append(DiffRow(kind=key[0], name=key[1], status=status, a_us=a_us, b_us=b_us,
                            delta_us=delta, delta_pct=pct, a_calls=a_calls, b_calls=b_calls))
    rows.sort(key=lambda r: (-abs(r.delta_us), r.kind, r.name))
    return rows


def _profiled(run: RankFigures) -> RecordedSteps:
    """Per rank, the µs of each profiled step (the step breakdown's)."""
    return {r: [float(s["dur_us"]) for figures in run[r] for s in figures.step_list()]
            for r in sorted(run)}


def _median(values: list[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _step_time(a: RecordedSteps, b: RecordedSteps, source: str) -> StepTime:
    da = [us for r in sorted(a) for us in a[r]]
    db = [us for r in sorted(b) for us in b[r]]
    ma, mb = _median(da), _median(db)
    delta = mb - ma if ma is not None and mb is not None else None
    return StepTime(source=source, a_median_us=ma, b_median_us=mb, a_steps=len(da),
                    b_steps=len(db), delta_us=delta,
                    regression_pct=100.0 * delta / ma if delta is not None and ma else None)


def _rank_steps(a: RecordedSteps, b: RecordedSteps, notes: list[str]) -> list[RankSteps]:
    ra, rb = set(a), set(b)
    pairs = [(r, r) for r in sorted(ra & rb)]
    if ra != rb:
        only_a, only_b = sorted(ra - rb), sorted(rb - ra)
        if not pairs and len(ra) == len(rb) == 1:
            pairs = [(only_a[0], only_b[0])]
            notes.append(f"A holds rank {only_a[0]} and B rank {only_b[0]}: compared with "
                         "each other")
        else:
            parts = [f"only A has rank(s) {_ranges(only_a)}" if only_a else "",
                     f"only B has rank(s) {_ranges(only_b)}" if only_b else ""]
            notes.append("the runs have different ranks: " + "; ".join(p for p in parts if p)
                         + " (per-rank step times compare the ranks both have; per-step "
                         "op and kernel figures are means over each run's own ranks)")
    rows = []
    for x, y in pairs:
        ma, mb = _median(a[x]), _median(b[y])
        delta = mb - ma if ma is not None and mb is not None else None
        rows.append(RankSteps(rank_a=x, rank_b=y, a_median_us=ma, b_median_us=mb,
                              delta_us=delta,
                              delta_pct=100.0 * delta / ma if delta is not None and ma else None))
    return rows


def _ranges(ranks: list[int]) -> str:
    """``0-3, 7``: consecutive ranks folded."""
    out: list[str] = []
    for r in ranks:
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


def _kind_word(kind: str) -> str:
    return {"cpu_op": "op", "user_annotation": "annotation", "gpu_memcpy": "memcpy",
            "gpu_memset": "memset"}.get(kind, kind)


def analyze(profile: Any) -> RunDiff:
    """The analysis of a ``diff`` Profile: the diff it holds, computed when it
    was made (``DiffPayload.diff``)."""
    return profile.payload.diff
