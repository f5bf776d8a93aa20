"""A run's tables from its ranks' figures (``rank_figures`` of each rank's traces).

Input: ``{rank: [figures of trace 1, figures of trace 2, ...]}``; a torchlens
run folder has one trace per profiled step, a torchrun job usually one per
rank. Per rank, times (µs) add up over its traces and shares are taken of the
sums, so a rank's temporal breakdown over three profiled steps is the
breakdown of the three together (HTA analyses one trace per rank; with one
trace the figures are HTA's). Ranks or traces without GPU work contribute
``None`` figures, never zeros.
"""

from __future__ import annotations

from typing import Any

from torchlens.analysis.runs.rows import (
    CollectiveOverlapRow,
    IdleRow,
    KernelRow,
    OverlapRow,
    StepRow,
    StepSkewRow,
    TemporalRow,
    TopKernelRow,
)
from torchlens.model.run_figures import RankFigures

TEMPORAL_US = ("span_us", "busy_us", "idle_us", "compute_us", "non_compute_us")


def _sum(values: list[Any]) -> float | None:
    present = [v for v in values if v is not None]
    return float(sum(present)) if present else None


def _pct(part: float | None, whole: float | None) -> float | None:
    return 100.0 * part / whole if part is not None and whole else None


def temporal_rows(ranks: RankFigures) -> list[TemporalRow]:
    """Per rank: span, idle, compute and non-compute µs (summed over its traces)
    and their shares of the span (HTA's temporal breakdown)."""
    rows = []
    for rank in sorted(ranks):
        parts = [f.temporal for f in ranks[rank]]
        us = {key: _sum([getattr(p, key) for p in parts]) for key in TEMPORAL_US}
        rows.append(TemporalRow(
            rank=rank, traces=len(parts), gpu=any(p.gpu for p in parts), **us,
            idle_pct=_pct(us["idle_us"], us["span_us"]),
            compute_pct=_pct(us["compute_us"], us["span_us"]),
            non_compute_pct=_pct(us["non_compute_us"], us["span_us"])))
    return rows


def idle_rows(ranks: RankFigures) -> list[IdleRow]:
    """Per rank and stream: idle µs split into host wait, kernel wait and other."""
    rows = []
    for rank in sorted(ranks):
        merged: dict[tuple[Any, Any], IdleRow] = {}
        for figures in ranks[rank]:
            for s in figures.idle:
                key = (s.device, s.stream)
                row = merged.setdefault(key, IdleRow(rank, key[0], key[1]))
                row.events += s.events or 0
                row.idle_us += s.idle_us or 0.0
                row.host_wait_us += s.host_wait_us or 0.0
                row.kernel_wait_us += s.kernel_wait_us or 0.0
                row.other_us += s.other_us or 0.0
        for row in merged.values():
            row.host_wait_pct = _pct(row.host_wait_us, row.idle_us)
            row.kernel_wait_pct = _pct(row.kernel_wait_us, row.idle_us)
            row.other_pct = _pct(row.other_us, row.idle_us)
            rows.append(row)
    return rows


def overlap_rows(ranks: RankFigures) -> list[OverlapRow]:
    """Per rank: communication µs, the part overlapped by compute, and the share
    (HTA's communication/computation overlap)."""
    rows = []
    for rank in sorted(ranks):
        parts = [f.overlap for f in ranks[rank]]
        comm = _sum([p.communication_us for p in parts])
        over = _sum([p.overlapped_us for p in parts])
        rows.append(OverlapRow(rank, comm, over, _pct(over, comm)))
    return rows


#: the ``collective`` of a rank's row for every collective together (HTA's figure)
ALL_COLLECTIVES = "all collectives"


def collective_overlap_rows(ranks: RankFigures) -> list[CollectiveOverlapRow]:
    """Per rank with communication kernels: a row for all collectives together
    (``overlap_rows``' figures), then one per collective it ran
    (``comm_overlap.COLLECTIVES`` order): ``communication_us``,
    ``overlapped_us``, ``exposed_us`` (not overlapped), ``overlap_pct`` and
    ``exposed_pct``, the exposed time's share of the rank's GPU timeline
    (``temporal_rows``' ``span_us``). Ranks without GPU work or without
    communication kernels have no rows."""
    from torchlens.analysis.trace.comm_overlap import COLLECTIVES

    span = {r.rank: r.span_us for r in temporal_rows(ranks)}
    total = {r.rank: r for r in overlap_rows(ranks)}
    rows = []
    for rank in sorted(ranks):
        whole = total[rank]
        if not whole.communication_us:
            continue
        sums: dict[str, list[float]] = {}
        for figures in ranks[rank]:
            split = (figures.collective_overlap.collectives
                     if figures.collective_overlap is not None else None) or {}
            for name, c in split.items():
                got = sums.setdefault(name, [0.0, 0.0])
                got[0] += c.communication_us or 0.0
                got[1] += c.overlapped_us or 0.0
        parts = [(ALL_COLLECTIVES, whole.communication_us, whole.overlapped_us)]
        parts += [(name, *sums[name]) for name in COLLECTIVES if name in sums]
        for name, comm, over in parts:
            exposed = comm - (over or 0.0)
            rows.append(CollectiveOverlapRow(rank, name, comm, over, exposed, _pct(over, comm),
                                             _pct(exposed, span.get(rank))))
    return rows


def kernel_rows(ranks: RankFigures) -> list[KernelRow]:
    """Per rank and kernel kind (compute, communication, memory, other): µs and count."""
    rows = []
    for rank in sorted(ranks):
        kinds: dict[str, KernelRow] = {}
        for figures in ranks[rank]:
            for kind, k in (figures.kernels.kinds or {}).items():
                row = kinds.setdefault(kind, KernelRow(rank, kind))
                row.us += k.us or 0.0
                row.count += k.count or 0
        total = sum(r.us for r in kinds.values())
        for row in kinds.values():
            row.pct = _pct(row.us, total)
            rows.append(row)
    return rows


def top_kernel_rows(ranks: RankFigures) -> list[TopKernelRow]:
    """Per rank, kind and kernel name: count and total µs over the rank's traces
    (each trace's top kernels; the names outside each trace's top are its ``rest``)."""
    rows = []
    for rank in sorted(ranks):
        names: dict[tuple[str, str], TopKernelRow] = {}
        for figures in ranks[rank]:
            for kind, tops in (figures.kernels.top or {}).items():
                for t in tops.kernels if tops is not None else []:
                    key = (kind, str(t.name))
                    row = names.setdefault(key, TopKernelRow(rank, kind, key[1]))
                    row.count += t.count or 0
                    row.total_us += t.total_us or 0.0
        rows += sorted(names.values(), key=lambda r: -r.total_us)
    return rows


def step_rows(ranks: RankFigures) -> list[StepRow]:
    """Per rank and ``ProfilerStep#N`` of its traces: the ``%%torchprof`` step
    breakdown (``analysis.trace.steps``: the TensorBoard plugin's definitions)."""
    return [StepRow(rank, **{k: (int(v) if k == "step" else float(v)) for k, v in row.items()})
            for rank in sorted(ranks) for figures in ranks[rank]
            for row in figures.step_list()]


def step_skew_rows(ranks: RankFigures) -> list[StepSkewRow]:
    """Per step number that every rank has: the median and the longest of the
    ranks' step times, the rank that took it (``longest_rank``: its wall time
    includes its waits for the others, so it is not the slow rank's verdict,
    ``analysis.ranks.slow``), and the skew = (longest - median) / median in %.
    A step number a rank lacks is left out (ranks profiled different steps)."""
    by_step: dict[int, dict[int, float]] = {}
    for row in step_rows(ranks):
        by_step.setdefault(row.step, {})[row.rank] = row.dur_us
    everyone = set(ranks)
    out = []
    for step in sorted(by_step):
        times = by_step[step]
        if set(times) != everyone:
            continue
        ordered = sorted(times.values())
        n = len(ordered)
        median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
        longest = max(times, key=lambda r: times[r])
        out.append(StepSkewRow(step, n, median, times[longest], longest,
                               _pct(times[longest] - median, median)))
    return out
