"""Per-step time breakdown with the TensorBoard profiler plugin's definitions.

Users compare these numbers with the plugin's "Overview" page, so the rules
follow it (pytorch/kineto tb_plugin, step_parser.py / overall_parser.py):

- Steps are the host ``ProfilerStep#N`` spans (``cpu_op`` or
  ``user_annotation``). When a trace has GPU activity, each step is widened to
  cover the device work its own runtime calls launched (a runtime call counts
  for a step if it lies wholly inside it; its kernels are found by
  correlation), and starts no earlier than the previous step ended, so steps
  never overlap and GPU work that lags the host is charged to its step.
- Each instant of a step is given to exactly one role, the first that is busy
  then in this priority order: Kernel, Memcpy, Memset, Communication, Runtime,
  DataLoader, CPU Exec, Other (nothing busy). So the columns add up to the
  step duration and, e.g., runtime calls hidden under running kernels count as
  kernel time, as in the plugin.
- Kernel = GPU kernels except communication; Communication = NCCL kernels
  (name ``^nccl``), shown apart as ``comm_us``; Runtime = ``cuda_runtime``
  calls; DataLoader = ``enumerate(DataLoader)#...__next__`` spans; CPU Exec =
  ``cpu_op`` spans.

Deliberate differences: the plugin drops trailing steps whose kernels look
cut off; we keep every step (dropping them silently would hide data). The
plugin recognises DataLoader spans only as ``cpu_op``; newer torch records
them as ``user_annotation``, so both count. Kernels launched through the
driver API (``cuLaunchKernel``, e.g. Triton) also widen their step.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from torchlens.model import Trace

if TYPE_CHECKING:  # pandas only where a frame is built: a run's workers never need it
    import pandas as pd

from torchlens.analysis.trace.events import (
    COMM_KERNEL,
    category_mask,
    name_mask,
    phase_mask,
)

STEP_COLUMNS = ["step", "start_us", "dur_us", "kernel_us", "memcpy_us",
                "memset_us", "runtime_us", "dataloader_us", "cpu_exec_us",
                "other_us", "comm_us"]
#: Roles in priority order (the plugin's); the index is the priority.
ROLES = ["kernel", "memcpy", "memset", "comm", "runtime", "dataloader", "cpu_exec"]
_STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
_DATALOADER = re.compile(r"^enumerate\(DataLoader\)#.*\.__next__$")


def step_rows(trace: Trace) -> np.ndarray:
    """Event rows of the host ``ProfilerStep#N`` spans, in time order."""
    ev = trace.events
    rows = np.flatnonzero(
        name_mask(trace, _STEP_NAME) & phase_mask(trace, "X")
        & category_mask(trace, "cpu_op", "user_annotation")
    )
    rows = rows[np.argsort(ev["ts"][rows], kind="stable")]
    tail = trace.meta.get("tail_step")
    if tail is not None and len(rows):
        # Set by the capture: the span the profiler opened at the last step()
        # call covers only the code after the final step, so it is not a step.
        rows = rows[ev.text("name")[rows] != tail]
    return rows


def step_breakdown(trace: Trace) -> pd.DataFrame:
    """One row per ``ProfilerStep#N``: µs in each role (see module docstring).

    Empty (with the columns) when the trace has no steps: the profiler was
    run without a schedule or ``prof.step()``.
    """
    import pandas as pd

    columns = step_columns(trace)
    if columns is None:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in STEP_COLUMNS})
    return pd.DataFrame(columns)[STEP_COLUMNS]


def step_records(trace: Trace) -> list[dict[str, int | float]]:
    """``step_breakdown(trace).to_dict("records")`` without pandas: one dict per
    step, keys in ``STEP_COLUMNS`` order, ``step`` an int and the rest floats
    (what a run's worker sends back; pandas costs more than the sums)."""
    columns = step_columns(trace)
    if columns is None:
        return []
    lists = [columns["step"].tolist()] + [columns[c].tolist() for c in STEP_COLUMNS[1:]]
    return [dict(zip(STEP_COLUMNS, row, strict=True)) for row in zip(*lists, strict=True)]


def step_columns(trace: Trace) -> dict[str, np.ndarray] | None:
    """``step_breakdown``'s columns as numpy arrays (``step`` int64, the rest
    float64), ``None`` when the trace has no steps."""
    ev = trace.events
    rows = step_rows(trace)
    if len(rows) == 0:
        return None
    starts, ends = device_aware_steps(trace, rows)
    spans = role_spans(trace)
    seconds = time_per_role(starts, ends, spans)
    names = ev.text("name")[rows]
    table = {
        "step": np.array([int(_STEP_NAME.match(n).group(1)) for n in names], np.int64),
        "start_us": starts,
        "dur_us": ends - starts,
    }
    for i, role in enumerate(ROLES):
        table[f"{role}_us"] = seconds[:, i]
    table["other_us"] = seconds[:, len(ROLES)]
    return table


def device_aware_steps(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host step spans widened to the device work they launched (plugin rule)."""
    ev = trace.events
    host_start = ev["ts"][rows]
    host_end = host_start + ev["dur"][rows]
    n = len(rows)
    rt = np.flatnonzero(category_mask(trace, "cuda_runtime", "cuda_driver")
                        & phase_mask(trace, "X"))
    gpu = np.flatnonzero(category_mask(trace, "kernel", "gpu_memcpy", "gpu_memset"))
    if len(rt) == 0 or len(gpu) == 0:
        return host_start, host_end
    rt_start = ev["ts"][rt]
    step_of_rt = np.searchsorted(host_start, rt_start, side="right") - 1
    inside = (step_of_rt >= 0)
    inside[inside] &= (rt_start + ev["dur"][rt])[inside] <= host_end[step_of_rt[inside]]
    # device event -> runtime call (by correlation) -> step
    corr = ev["correlation"][rt][inside]
    order = np.argsort(corr, kind="stable")
    corr, rt_step = corr[order], step_of_rt[inside][order]
    g_corr = ev["correlation"][gpu]
    pos = np.clip(np.searchsorted(corr, g_corr), 0, max(len(corr) - 1, 0))
    matched = (len(corr) > 0) & (g_corr >= 0)
    if len(corr):
        matched &= corr[pos] == g_corr
    if not matched.any():
        return host_start, host_end
    g_start, g_end = ev["ts"][gpu], ev["ts"][gpu] + ev["dur"][gpu]
    g_step = rt_step[pos[matched]]
    dev_min = np.full(n, np.inf)
    dev_max = np.full(n, -np.inf)
    np.minimum.at(dev_min, g_step, g_start[matched])
    np.maximum.at(dev_max, g_step, g_end[matched])

    prev_end = host_start[0]
    if np.isfinite(dev_min[0]):
        early = g_end[~matched]
        early = early[early < dev_min[0]]
        if len(early):
            prev_end = max(prev_end, early.max())
    starts, ends = np.empty(n), np.empty(n)
    for i in range(n):
        start = max(prev_end, host_start[i])
        end = max(host_end[i], dev_max[i]) if np.isfinite(dev_max[i]) else host_end[i]
        starts[i], ends[i] = start, max(end, start)
        prev_end = ends[i]
    return starts, ends


def role_spans(trace: Trace) -> list[tuple[np.ndarray, np.ndarray]]:
    """(start, end) arrays of the events of each role, in ``ROLES`` order."""
    ev = trace.events
    ts, end = ev["ts"], ev["ts"] + ev["dur"]
    x = phase_mask(trace, "X")
    kernel = category_mask(trace, "kernel")
    comm = kernel & name_mask(trace, COMM_KERNEL)
    dataloader = (name_mask(trace, _DATALOADER) & x
                  & category_mask(trace, "cpu_op", "user_annotation"))
    steps = name_mask(trace, _STEP_NAME)
    masks = [
        kernel & ~comm,
        category_mask(trace, "gpu_memcpy"),
        category_mask(trace, "gpu_memset"),
        comm,
        category_mask(trace, "cuda_runtime") & x,
        dataloader,
        category_mask(trace, "cpu_op") & x & ~dataloader & ~steps,
    ]
    return [(ts[m], end[m]) for m in masks]


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as sorted, disjoint (start, end) arrays."""
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    new = np.r_[True, s[1:] > e[:-1]]
    group_end = np.r_[np.flatnonzero(new)[1:] - 1, len(s) - 1]
    return s[new], e[group_end]


def _covered(points: np.ndarray, merged: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    s, e = merged
    if len(s) == 0:
        return np.zeros(len(points), bool)
    i = np.searchsorted(s, points, side="right") - 1
    return (i >= 0) & (points < e[np.maximum(i, 0)])


def time_per_role(starts: np.ndarray, ends: np.ndarray,
                   spans: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """µs per (step, role), each instant going to the highest-priority busy role.

    Cuts the timeline at every interval boundary; between two cuts the set of
    busy roles is constant, so testing one midpoint per piece is exact.
    """
    merged = [merge_intervals(s, e) for s, e in spans]
    cuts = np.unique(np.concatenate(
        [starts, ends] + [a for m in merged for a in m]))
    cuts = cuts[(cuts >= starts.min()) & (cuts <= ends.max())]
    mids, lengths = (cuts[:-1] + cuts[1:]) / 2, np.diff(cuts)
    role = np.full(len(mids), len(ROLES))  # Other unless a role is busy
    for priority in range(len(ROLES) - 1, -1, -1):
        role[_covered(mids, merged[priority])] = priority
    step = np.searchsorted(starts, mids, side="right") - 1
    in_step = (step >= 0) & (mids < ends[np.maximum(step, 0)])
    n_roles = len(ROLES) + 1
    flat = np.bincount(step[in_step] * n_roles + role[in_step],
                       weights=lengths[in_step], minlength=len(starts) * n_roles)
    return flat.reshape(len(starts), n_roles)
