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
- Run-to-run noise (``noise_us``): two runs of one unchanged job differ in
  their median step time by about as much as one step differs from the next
  (machine load, placement, the allocator: found across repeated healthy
  jobs, where the medians of two runs differed by up to 15% and by less than
  the sum of their spreads). A run's spread is the median over its ranks of
  each rank's step-to-step spread (``chance.robust_spread``: 1.4826 x the
  median absolute deviation of its step times, which a few long steps do not
  move); the bound is A's spread plus B's. It needs ``NOISE_MIN_STEPS`` steps
  on a rank (else no bound: ``None``). A step time change within it is
  ``within_noise``: the verdict says so instead of naming a change, passes,
  and names no phase and no op or kernel that got faster or slower (their
  figures are the same noisy steps', and the ops' are of the few profiled
  ones); only ops and kernels added or removed are still named. Each rank
  pair gets the same bound from its own steps, and a phase's change in the
  headline must exceed that phase's bound (its spread in A plus in B) too.
- Per rank: the median step time (same source) of each rank both runs have;
  when they share no rank but each has exactly one (two single traces, e.g.
  rank 0 of one job and rank 1 of another), those two are compared. Ranks
  only one run has are named in ``notes``.
- Headline (``phase_headline``, both runs with step records): per rank both
  runs have, the median ms a step of each phase (``analysis.ranks.steps``:
  data, forward, backward, optimizer, collective, and ``other``, the rest of
  the step, said as "time between phases": a sleep there is no forward or
  optimizer work) in A and in B. A phase counts when its change is at least
  ``HEADLINE_FLOOR_US`` (0.5 ms) and ``HEADLINE_FLOOR_PCT`` (5%) of A's
  median step, in the direction the step time went, and beyond the phase's
  run-to-run noise on that rank; no phase counts when the step time changed
  within its noise. A rank's own work
  (every phase but backward and collective) is looked at first: backward and
  collective are where a rank waits for a late one (DDP's gradient
  all-reduce runs in backward), so they grow on the ranks that wait, not on
  the one they wait for; only when no own-work phase changed are they named.
  The phase and rank with the largest change lead; when every rank's change
  in that phase counts and is at least half the largest, it is "every rank"
  (before and after: the median over the ranks). Else the other ranks' phase
  that grew most, if it counts, is where they wait for that rank.
- Verdict: the step time change, then the headline; when B's step time is below A's, the
  largest speedup (the faster or removed row whose time fell most); and the
  largest slowdown (slower or added), on a faster run too, so what got
  slower is not hidden. ``small`` and ``same`` rows are never named.
"""

from __future__ import annotations

import statistics
from typing import Any

from torchlens.analysis.changes import change_status
from torchlens.analysis.ranks.chance import robust_spread
from torchlens.analysis.ranks.steps import PHASES, record_ms
from torchlens.analysis.runs.op_totals import GPU_KINDS, HOST_KINDS
from torchlens.model.findings import INFO, PASSED, RUN_DIFF, WARNING, Figure, Finding
from torchlens.model.payloads import (
    DiffHeadline,
    DiffRow,
    DiffThresholds,
    DiffUnits,
    RankSteps,
    RunDiff,
    StepTime,
)
from torchlens.model.records import StepRecord
from torchlens.model.run_figures import OpTotals, RankFigures
from torchlens.model.units import (
    format_duration,
    format_percent,
    format_us_as_ms,
    plural,
)

#: Per rank, the µs of each recorded step (``t1 - t0`` of its step records).
RecordedSteps = dict[int, list[float]]
#: Per rank, per phase (``PHASES`` and ``other``), the µs of each recorded step.
RecordedPhases = dict[int, dict[str, list[float]]]
#: a phase's change counts when at least this (µs a step) and this share of A's step
HEADLINE_FLOOR_US = 500.0
HEADLINE_FLOOR_PCT = 5.0
#: where a rank waits for the others (``analysis.ranks.slow``'s sync)
WAIT_PHASES = ("backward", "collective")
#: what runs in a waiting phase, for the headline's sentence
_WAITS_IN = {"backward": "DDP's gradient all-reduce runs there",
             "collective": "the explicit collectives"}
SAME_PCT = 5.0
SAME_US = 10.0
#: The row that sums, per kind, the names outside each trace's kept top.
REST = "(other names)"
STATUSES = ("added", "removed", "slower", "faster", "small", "same")
#: a rank's step-to-step spread is read from at least this many of its steps
NOISE_MIN_STEPS = 8
RECORDED, PROFILED = "step records", "profiled steps"


def diff_runs(a: RankFigures, b: RankFigures, *,
              recorded: tuple[RecordedSteps | None, RecordedSteps | None] = (None, None),
              phases: tuple[RecordedPhases | None, RecordedPhases | None] = (None, None),
              unread: tuple[list[str], list[str]] = ([], []),
              same_pct: float = SAME_PCT, same_us: float = SAME_US) -> RunDiff:
    """The diff of run ``b`` against run ``a`` (see the module docstring):
    ``ops``, ``kernels``, ``step_time``, ``rank_steps``, ``notes``, ``summary``
    (rows per status), ``headline`` (the rank and phase that changed) and
    ``verdict`` (a ``Finding``, code ``run_diff``). ``recorded``: each run's
    step records (None: it has none); ``phases``: their phases (``add_phases``);
    ``unread``: what of each run's folder could not be read (its sentences), said
    first: the figures compare what was read."""
    notes: list[str] = [f"{label}: {said.rstrip('.')}; the diff compares what was read"
                        for label, side in (("A", unread[0]), ("B", unread[1])) for said in side]
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
    if source == RECORDED and phases[0] and phases[1] and not step_time.within_noise:
        out.headline = phase_headline(phases[0], phases[1], rank_steps, step_time)
    out.verdict = verdict(out, (len(a), len(b)))
    return out


def add_phases(out: RecordedPhases, rank: int, rec: StepRecord) -> None:
    """Adds one step record's phases (µs; a phase whose timer never ran counts
    0, ``other`` the rest of the step) to ``out``."""
    _, phases, other = record_ms(rec)
    cell = out.setdefault(rank, {})
    for name, ms in zip(PHASES, phases, strict=True):
        cell.setdefault(name, []).append((ms or 0.0) * 1e3)
    cell.setdefault("other", []).append(other * 1e3)


def phase_headline(a: RecordedPhases, b: RecordedPhases, pairs: list[RankSteps],
                   step_time: StepTime) -> DiffHeadline | None:
    """The rank (or every rank) and phase whose median time a step changed most
    from A to B, in the step time's direction, and where the other ranks wait
    for it (the module docstring); None when no phase changed enough."""
    sign = -1.0 if (step_time.delta_us or 0.0) < 0 else 1.0
    floor = max(HEADLINE_FLOOR_US, HEADLINE_FLOOR_PCT / 100 * (step_time.a_median_us or 0.0))
    med: dict[tuple[int, str], tuple[float, float]] = {}
    for p in pairs:
        pa, pb = a.get(p.rank_a, {}), b.get(p.rank_b, {})
        for phase in (*PHASES, "other"):
            if pa.get(phase) and pb.get(phase):
                med[(p.rank_b, phase)] = (float(statistics.median(pa[phase])),
                                          float(statistics.median(pb[phase])))
    if not med:
        return None
    ranks = sorted({r for r, _ in med})

    def change(key: tuple[int, str]) -> float:
        before, after = med[key]
        return sign * (after - before)

    # a phase's own run-to-run noise on that rank: its spread in A plus in B
    noise = {(p.rank_b, phase): _bound(_spread(a.get(p.rank_a, {}).get(phase, [])),
                                       _spread(b.get(p.rank_b, {}).get(phase, [])))
             for p in pairs for phase in (*PHASES, "other")}

    def beyond(key: tuple[int, str], least: float) -> bool:
        return change(key) >= max(least, noise.get(key) or 0.0)

    counted = [k for k in med if beyond(k, floor)]
    own = [k for k in counted if k[1] not in WAIT_PHASES]
    if not counted:
        return None
    rank, phase = max(own or counted, key=lambda k: (change(k), -k[0]))
    largest = change((rank, phase))
    every = len(ranks) > 1 and all(
        (r, phase) in med and beyond((r, phase), max(floor, largest / 2)) for r in ranks)
    if every:
        before = float(statistics.median(med[(r, phase)][0] for r in ranks))
        after = float(statistics.median(med[(r, phase)][1] for r in ranks))
        who, whose = None, "every rank's"
    else:
        before, after = med[(rank, phase)]
        who, whose = rank, f"rank {rank}'s"
    delta = after - before
    sentence = (f"{whose} {phase_words(phase)} {format_duration(delta, signed=True)} a step "
                f"({format_us_as_ms(before)} -> {format_us_as_ms(after)}"
                + (", median of the ranks" if every else "") + ")")
    waiting = waiting_delta = None
    others = [r for r in ranks if r != rank]
    if not every and others and sign > 0:
        grew, bound = {}, {}
        for ph in (*PHASES, "other"):
            values = [change((r, ph)) for r in others if (r, ph) in med]
            if values and ph != phase:
                grew[ph] = float(statistics.median(values))
                bound[ph] = float(statistics.median(noise.get((r, ph)) or 0.0
                                                    for r in others if (r, ph) in med))
        if grew and (best := max(grew, key=lambda ph: grew[ph])) \
                and grew[best] >= max(floor, bound[best]):
            waiting, waiting_delta = best, grew[best]
            them = ("the other rank waits for it in its" if len(others) == 1
                    else "the other ranks wait for it in their")
            sentence += (f"; {them} {phase_words(best)} "
                         f"({format_duration(waiting_delta, signed=True)} a step"
                         + (f"; {_WAITS_IN[best]}" if best in _WAITS_IN else "") + ")")
    return DiffHeadline(rank=who, ranks=ranks if every else [rank], phase=phase,
                        before_us=before, after_us=after, delta_us=delta,
                        waiting_phase=waiting, waiting_delta_us=waiting_delta,
                        sentence=sentence)


def phase_words(phase: str) -> str:
    """A phase as the headline says it: ``data phase``; ``other``, the step's time
    outside every timed phase, as ``time between phases (...)``: a sleep,
    logging or I/O there is no forward or optimizer work."""
    if phase == "other":
        return "time between phases (a sleep, logging or I/O no phase timer saw)"
    return f"{phase} phase"


def regressed(diff: RunDiff, pct: float) -> bool | None:
    """Whether B's median step time is more than ``pct`` % above A's and the
    change is beyond the run-to-run noise (``None`` when either run has no
    step time): a gate must not fail on what two runs of one job differ by."""
    reg = diff.step_time.regression_pct
    return None if reg is None else reg > pct and not diff.step_time.within_noise


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
        severity = WARNING if st.regression_pct > diff.thresholds.same_pct \
            and not st.within_noise else PASSED
        which = "recorded" if st.source == RECORDED else "profiled"
        head = (f"step time {format_us_as_ms(st.a_median_us)} -> "
                f"{format_us_as_ms(st.b_median_us)} "
                f"({format_percent(st.regression_pct, signed=True)}, median of "
                f"{st.a_steps} {which} steps of A and {st.b_steps} of B)")
        figures += [Figure("a_median_us", st.a_median_us, "µs"),
                    Figure("b_median_us", st.b_median_us, "µs"),
                    Figure("regression_pct", st.regression_pct, "%")]
        if st.noise_us is not None:
            figures.append(Figure("noise_us", st.noise_us, "µs"))
        else:  # a change that may be noise is said as one: say that it may be
            head = head[:-1] + (", with no run-to-run noise bound: that needs both "
                                "runs' step records, a torchlens run folder's steps.jsonl "
                                "with a readable manifest.json)")
    if st.within_noise and st.noise_us is not None:
        return _within_noise(diff, head, figures, severity, per_words(diff, ranks))
    per = per_words(diff, ranks)
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
    if diff.headline is not None:
        # the rank and phase lead; the op and kernel rows are the evidence after them
        parts.insert(0, diff.headline.sentence)
        figures.append(Figure("phase_delta_us", diff.headline.delta_us, "µs"))
    tail = "; ".join(parts)
    return Finding(severity, f"{head}; {tail}", tuple(figures), code=RUN_DIFF)


def per_words(diff: RunDiff, ranks: tuple[int, int]) -> str:
    """What an op's change is a figure of: per step (and rank, a mean over the
    ranks, with several) or per trace."""
    per = "per step" if diff.per == "step" else "per trace"
    if diff.per == "step" and max(ranks) > 1:
        per += (f" and rank, mean of {ranks[0]} ranks" if ranks[0] == ranks[1]
                else f" and rank, mean of {plural(ranks[0], 'rank')} of A and {ranks[1]} of B")
    return per


def _within_noise(diff: RunDiff, head: str, figures: list[Figure], severity: str,
                  per: str) -> Finding:
    """The verdict of a step time change within the run-to-run noise: said as
    noise, not as a change; only ops and kernels added or removed are named
    (the faster and slower ones are figures of the same noisy steps)."""
    noise = format_us_as_ms(diff.step_time.noise_us)
    parts = [f"{head}: within run-to-run noise (±{noise}: each run's step-to-step "
             "spread, added)", "no change beyond noise"]
    rows = [r for r in diff.ops + diff.kernels if r.name != REST]
    added = [r for r in rows if r.status == "added"]
    removed = [r for r in rows if r.status == "removed"]
    if added:
        parts.append(_change("largest addition", max(added, key=lambda r: r.delta_us),
                             per, "added"))
    if removed:
        parts.append(_change("largest removal", min(removed, key=lambda r: r.delta_us),
                             per, "removed"))
    return Finding(severity, "; ".join(parts), tuple(figures), code=RUN_DIFF)


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


def _spread(steps: list[float]) -> float | None:
    """One rank's step-to-step spread (µs); None below ``NOISE_MIN_STEPS`` steps."""
    return robust_spread(steps) if len(steps) >= NOISE_MIN_STEPS else None


def run_spread(steps: RecordedSteps) -> float | None:
    """A run's step-to-step spread: the median over its ranks of each rank's
    (``_spread``); None when no rank has enough steps."""
    spreads = [s for r in sorted(steps) if (s := _spread(steps[r])) is not None]
    return _median(spreads)


def _bound(a: float | None, b: float | None) -> float | None:
    """The run-to-run noise bound of a change from A to B: their spreads, added."""
    return a + b if a is not None and b is not None else None


def _within(delta: float | None, noise: float | None) -> bool | None:
    return abs(delta) <= noise if delta is not None and noise is not None else None


def _step_time(a: RecordedSteps, b: RecordedSteps, source: str) -> StepTime:
    da = [us for r in sorted(a) for us in a[r]]
    db = [us for r in sorted(b) for us in b[r]]
    ma, mb = _median(da), _median(db)
    delta = mb - ma if ma is not None and mb is not None else None
    sa, sb = run_spread(a), run_spread(b)
    noise = _bound(sa, sb)
    return StepTime(source=source, a_median_us=ma, b_median_us=mb, a_steps=len(da),
                    b_steps=len(db), delta_us=delta,
                    regression_pct=100.0 * delta / ma if delta is not None and ma else None,
                    a_spread_us=sa, b_spread_us=sb, noise_us=noise,
                    within_noise=_within(delta, noise))


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
        noise = _bound(_spread(a[x]), _spread(b[y]))
        rows.append(RankSteps(rank_a=x, rank_b=y, a_median_us=ma, b_median_us=mb,
                              delta_us=delta,
                              delta_pct=100.0 * delta / ma if delta is not None and ma else None,
                              noise_us=noise, within_noise=_within(delta, noise)))
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
