"""Communication overlapped by compute, split by collective.

HTA's ``comm_comp_overlap`` (``figures``) lumps every communication kernel
together. FSDP's tuning needs them apart: its all_gathers (unshard, and the
prefetch of the next module's parameters) should run under the current
module's compute, its reduce_scatters under the rest of the backward pass.
The all_gather time *not* overlapped (``exposed_us``) is prefetch that failed
to hide: the GPU waited for parameters. DDP's all_reduce is its own row.

Which collective a communication kernel runs is read off its name (NCCL's
and RCCL's share them): ``ncclKernel_AllGather_RING_LL_Sum_int8_t``,
``ncclDevKernel_AllGather_RING_LL(...)``, ``..._ReduceScatter_...``,
``..._AllReduce_...``; anything else (Broadcast, SendRecv, AllToAll, and
NCCL's ``ncclDevKernel_Generic``, which names no collective) is ``other``.

Per collective, as HTA's figure: ``communication_us`` is the union of its
kernels, ``overlapped_us`` the part of it during which a compute kernel
runs, ``exposed_us`` the rest, ``overlap_pct`` = overlapped / communication.
Collectives of different kinds can run at once on their own streams (FSDP's
reduce_scatter of one module during the next one's all_gather), so the rows
can add up to more than the total communication time.

Only GPU kernels are timed: a CPU (gloo) run has none, and these figures are
``None`` for it, never 0.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np

from torchlens.analysis.trace.events import category_mask
from torchlens.analysis.trace.gpu import (
    COMMUNICATION,
    COMPUTE,
    GpuWork,
    gpu_work,
    kind_of,
)
from torchlens.analysis.trace.steps import merge_intervals
from torchlens.model import Trace
from torchlens.model.run_figures import CollectiveOverlap, CollectiveTime

#: The collectives told apart, in the order every view lists them.
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "other")
_NAMES = ((0, re.compile(r"all_?gather", re.IGNORECASE)),
          (1, re.compile(r"reduce_?scatter", re.IGNORECASE)),
          (2, re.compile(r"all_?reduce", re.IGNORECASE)))


def collective_of(name: str) -> str:
    """The collective a communication kernel's name runs (``COLLECTIVES``)."""
    for i, pattern in _NAMES:
        if pattern.search(name):
            return COLLECTIVES[i]
    return "other"


def collective_overlap(trace: Trace, include_last_step: bool = False) -> CollectiveOverlap:
    """Per collective of one rank: ``communication_us``, ``overlapped_us``,
    ``exposed_us`` and ``overlap_pct`` (module docstring), over the GPU work
    of HTA's window (``gpu.gpu_work``).

    ``gpu`` and ``collectives`` (name -> its ``CollectiveTime``): only the
    collectives the rank ran are keys; ``collectives`` is ``None`` without GPU work.
    """
    return overlap_of_work(gpu_work(trace, include_last_step), trace)


def overlap_of_work(work: GpuWork, trace: Trace) -> CollectiveOverlap:
    """``collective_overlap`` of GPU work already selected."""
    if not len(work):
        return CollectiveOverlap(gpu=False)
    labels = trace.events.categories["name"]
    return CollectiveOverlap(gpu=True, collectives=split(work.start, work.end, work.kind,
                                                         work.name, labels))


def overlap_of_rows(trace: Trace, rows: np.ndarray) -> dict[str, Any]:
    """``collective_overlap`` of the GPU work among ``rows`` of the events table
    (kernels, memcpys and memsets; other rows are ignored), with no window:
    a profiled step's own GPU work (``analysis.ranks.summary``), as JSON
    (``msgspec.to_builtins`` of the ``CollectiveOverlap``): the step summary
    that holds it travels as JSON."""
    return msgspec.to_builtins(_overlap_of_rows(trace, rows))  # type: ignore[no-any-return]


def _overlap_of_rows(trace: Trace, rows: np.ndarray) -> CollectiveOverlap:
    ev = trace.events
    rows = rows[category_mask(trace, "kernel", "gpu_memcpy", "gpu_memset")[rows]]
    rows = rows[np.isfinite(ev["ts"][rows]) & np.isfinite(ev["dur"][rows])]
    if not len(rows):
        return CollectiveOverlap(gpu=False)
    labels = ev.categories["name"]
    codes = ev["name"][rows]
    distinct, inverse = np.unique(codes, return_inverse=True)
    table = np.array([kind_of(labels[c] if c >= 0 else "") for c in distinct], np.int64)
    kind = table[inverse.reshape(-1)]
    kind[~category_mask(trace, "kernel")[rows]] = -1  # memcpy/memset: memory, whatever its name
    start = ev["ts"][rows]
    return CollectiveOverlap(gpu=True,
                             collectives=split(start, start + ev["dur"][rows], kind, codes, labels))


def split(start: np.ndarray, end: np.ndarray, kind: np.ndarray, codes: np.ndarray,
          labels: list[str]) -> dict[str, CollectiveTime]:
    """Per collective present: its communication kernels' union, the part under
    compute, the rest, and the share. ``kind`` holds ``gpu.KINDS`` indices,
    ``codes`` the events table's name codes."""
    comp = kind == COMPUTE
    cs, ce = merge_intervals(start[comp], end[comp])
    comm = np.flatnonzero(kind == COMMUNICATION)
    distinct, inverse = np.unique(codes[comm], return_inverse=True)
    which = np.array([COLLECTIVES.index(collective_of(labels[c] if c >= 0 else ""))
                      for c in distinct], np.int64)[inverse.reshape(-1)] if len(comm) else comm
    out: dict[str, CollectiveTime] = {}
    for i, name in enumerate(COLLECTIVES):
        pick = comm[which == i]
        if not len(pick):
            continue
        s, e = merge_intervals(start[pick], end[pick])
        total = float((e - s).sum())
        over = intersection(s, e, cs, ce)
        out[name] = CollectiveTime(communication_us=total, overlapped_us=over,
                                   exposed_us=total - over,
                                   overlap_pct=100.0 * over / total if total else None)
    return out


def intersection(a_start: np.ndarray, a_end: np.ndarray, b_start: np.ndarray,
                 b_end: np.ndarray) -> float:
    """Length of the intersection of two unions of disjoint, sorted intervals
    (``merge_intervals``' output): HTA's sweep, each boundary adding or
    removing its side's bit, the time in state 3 summed."""
    if not len(a_start) or not len(b_start):
        return 0.0
    t = np.concatenate([a_start, a_end, b_start, b_end])
    d = np.concatenate([np.ones(len(a_start), np.int64), -np.ones(len(a_end), np.int64),
                        np.full(len(b_start), 2), np.full(len(b_end), -2)])
    order = np.argsort(t, kind="stable")
    t, state = t[order], np.cumsum(d[order])
    return float(np.diff(t)[state[:-1] == 3].sum())
