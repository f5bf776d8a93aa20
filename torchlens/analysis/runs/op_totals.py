"""Per-name figures of a run's traces: ``run.ops()``'s op table per rank
(``run_op_table``) and, for ``torchlens diff``, per-name totals of one trace's
CPU ops and GPU work, bounded (``op_totals``).

Both are computed in the rank's worker (``frontends.runs.api._trace_figures``:
``op_totals`` and the bounded ``analysis.trace.ops.op_sums``) so only a few KB
travel, whatever the trace holds.

Definitions of ``op_totals``:

- Kinds: ``cpu_op`` and ``user_annotation`` (host, complete events of those
  categories) and ``kernel``, ``gpu_memcpy``, ``gpu_memset`` (GPU work). The
  ``ProfilerStep#N`` spans themselves are left out: their names change every
  step, and the step time is the step breakdown's figure.
- Which events count: when the trace has ``ProfilerStep#N`` spans (the same
  spans as the ``%%torchprof`` step breakdown, ``analysis.trace.steps.step_rows``),
  a host event counts when it starts inside one of them (start >= step start
  and < step end); GPU work counts when the host event that launched it (same
  ``correlation`` id) starts inside one. Work before the first step, after the
  last one or between steps, and GPU work whose launch is not in the trace,
  is left out, so the totals divided by ``steps`` are per-step figures.
  Without ``ProfilerStep#N`` spans every event counts and ``steps`` is 0 (the
  diff then works per trace).
- Per kind and name: ``count`` (events) and ``us`` (sum of durations).
- Bound: per kind, the ``top`` names with the most time (ties by name) are
  kept; the others are summed into ``rest`` (``names``, ``count``, ``us``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from torchlens.analysis.trace.events import category_mask, name_mask, phase_mask
from torchlens.analysis.trace.gpu import STEP_NAME
from torchlens.analysis.trace.ops import OpSums, merged, op_frame
from torchlens.analysis.trace.steps import step_rows
from torchlens.model import Trace
from torchlens.model.run_figures import NameTotals, OpTotals, OtherNames

if TYPE_CHECKING:  # imported where a frame is built: op_totals serves pandas-free workers
    import pandas as pd

HOST_KINDS = ("cpu_op", "user_annotation")
GPU_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
KINDS = HOST_KINDS + GPU_KINDS
#: Names kept per kind and trace: about 250 x 5 names of 20-200 characters, so
#: a trace's totals stay within a few tens of KB.
TOP_NAMES = 250


def op_totals(trace: Trace, top: int = TOP_NAMES) -> OpTotals:
    """Per kind: the ``top`` names by total µs with their counts, and the rest
    summed; ``steps``: how many ``ProfilerStep#N`` spans the totals cover
    (0: none, the totals are the whole trace's). See the module docstring."""
    ev = trace.events
    x = phase_mask(trace, "X") & np.isfinite(ev["ts"]) & np.isfinite(ev["dur"])
    spans = step_rows(trace)
    steps = len(spans)
    host = x & category_mask(trace, *HOST_KINDS) & ~name_mask(trace, STEP_NAME)
    gpu = x & category_mask(trace, *GPU_KINDS)
    if steps:
        starts = ev["ts"][spans]
        ends = starts + ev["dur"][spans]
        host &= _inside(ev["ts"], starts, ends)
        gpu &= _launched_inside(trace, gpu, starts, ends)
    labels = trace.events.categories["cat"]
    kinds = {}
    for kind in KINDS:
        if kind not in labels:
            continue
        pick = (host | gpu) & (ev["cat"] == labels.index(kind))
        if pick.any():
            kinds[kind] = _per_name(trace, np.flatnonzero(pick), top)
    return OpTotals(steps=steps, kinds=kinds)


def _inside(ts: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each time lies in one of the (non-overlapping, start-sorted) spans."""
    i = np.searchsorted(starts, ts, side="right") - 1
    ok = i >= 0
    out = np.zeros(len(ts), bool)
    out[ok] = ts[ok] < ends[i[ok]]
    return out


def _launched_inside(trace: Trace, gpu: np.ndarray, starts: np.ndarray,
                     ends: np.ndarray) -> np.ndarray:
    """GPU rows whose launching host event (same correlation) starts in a span."""
    ev = trace.events
    corr = ev["correlation"]
    host = ~category_mask(trace, *GPU_KINDS, "gpu_user_annotation", "cuda_sync")
    host &= phase_mask(trace, "X") & (corr >= 0)
    launchers = np.flatnonzero(host)
    in_step = corr[launchers][_inside(ev["ts"][launchers], starts, ends)]
    return gpu & np.isin(corr, in_step) & (corr >= 0)


def _per_name(trace: Trace, rows: np.ndarray, top: int) -> NameTotals:
    ev = trace.events
    codes, group = np.unique(ev["name"][rows], return_inverse=True)
    group = group.reshape(-1)
    count = np.bincount(group)
    total = np.bincount(group, weights=ev["dur"][rows])
    labels = trace.events.categories["name"]
    names = [labels[c] if c >= 0 else "" for c in codes]
    order = sorted(range(len(codes)), key=lambda g: (-total[g], names[g]))
    shown, rest = order[:top], order[top:]
    return NameTotals(names=[names[g] for g in shown], count=[int(count[g]) for g in shown],
                      us=[float(total[g]) for g in shown],
                      rest=(OtherNames(names=len(rest), count=int(count[rest].sum()),
                                       us=float(total[rest].sum())) if rest else None))


def run_op_table(per_rank: dict[int, list[OpSums]]) -> pd.DataFrame:
    """``run.ops()``: each rank's op table, its traces' op sums merged
    (``ops.merged``) and made a table by ``ops.op_frame``, the function that
    makes ``%%torchprof``'s: the same columns (``OP_COLUMNS``) and figures.
    More than one rank: a ``rank`` column first, ranks in order, each rank's
    rows by total CPU time. Last, ``steps``: the ``ProfilerStep#N`` spans in
    the rank's traces (the figures cover the whole traces)."""
    import pandas as pd

    tables = []
    for rank, sums in sorted(per_rank.items()):
        one = merged(sums)
        table = op_frame(one)
        table["steps"] = one.steps
        if len(per_rank) > 1:
            table.insert(0, "rank", rank)
        tables.append(table)
    shown = [t for t in tables if len(t)] or tables[:1]  # a rank without ops adds no row
    if not shown:
        return op_frame(OpSums([], [], [], [], [], [], [])).assign(steps=0)
    return pd.concat(shown, ignore_index=True) if len(shown) > 1 else shown[0]
