"""Helpers on a trace's events table that the trace, rank and run analyses share:
masks by category, phase and name, the innermost enclosing span, look-ups by
id, one row's text, and the table's clock.

They work on the numpy columns and build no pandas frame, so a rank's worker
can use them after every profiled step.

Times. The events table counts ``ts`` in µs from ``meta["t0_us"]`` (the
earliest raw ``ts``). Newer Kineto writes raw ``ts`` as µs since
``baseTimeNanoseconds`` (a unix time rounded down to whole seconds: base plus
ts is ``time.time()`` at the event, checked on torch 2.13 here), older Kineto
writes unix µs and no base. So unix seconds = base/1e9 + (t0_us + ts)/1e6,
with base 0 when the trace has none. (Some older shared traces carry a base
while their ts count from another clock, e.g. a100_ddp's lands 52 days after
its base; nothing in such a file tells, so they are taken as written.)
"""

from __future__ import annotations

import re

import numpy as np

from torchlens.model import Trace

#: Communication kernels: NCCL's old (``ncclKernel*``) and new (``ncclDevKernel*``).
COMM_KERNEL = re.compile(r"^nccl")
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
#: The host calls that launch GPU work (a GPU event's ``correlation`` is its
#: launch's), the one list every launch figure reads. Kineto draws a launch flow
#: from these (libkineto ``RuntimeActivity::flowStart``: cudaLaunchKernel,
#: cudaLaunchKernelExC, the cooperative launches, cudaGraphLaunch and the
#: cbids cudaMemcpy .. cudaMemset2DAsync; ``DriverActivity``: cuLaunchKernel,
#: newer Kineto cuLaunchKernelEx), names them by ``runtimeCbidName``
#: (``cupti_strings.cpp``, where the per-thread default stream forms end in
#: ``_ptsz``), and HTA adds MTIA's and ROCm's (``get_runtime_launch_events_query``).
LAUNCH_NAMES = (
    "cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaLaunchKernelExC",
    "cudaLaunchKernelExC_ptsz", "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernel_ptsz", "cudaLaunchCooperativeKernelMultiDevice",
    "cudaGraphLaunch", "cudaGraphLaunch_ptsz",
    "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpyToArray", "cudaMemcpy2DToArray",
    "cudaMemcpyFromArray", "cudaMemcpy2DFromArray", "cudaMemcpyArrayToArray",
    "cudaMemcpy2DArrayToArray", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol",
    "cudaMemcpyAsync", "cudaMemcpyToArrayAsync", "cudaMemcpyFromArrayAsync",
    "cudaMemcpy2DAsync", "cudaMemcpy2DToArrayAsync", "cudaMemcpy2DFromArrayAsync",
    "cudaMemcpyToSymbolAsync", "cudaMemcpyFromSymbolAsync", "cudaMemcpyAsync_ptsz",
    "cudaMemcpy2DAsync_ptsz", "cudaMemcpyPeerAsync",
    "cudaMemset", "cudaMemset2D", "cudaMemsetAsync", "cudaMemset2DAsync",
    "cudaMemsetAsync_ptsz", "cudaMemset2DAsync_ptsz",
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
    "runFunction - job_prep_and_submit_for_execution",
    "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel",
    "hipGraphLaunch", "hipMemsetAsync", "hipMemcpyAsync", "hipMemcpyWithStream",
)


def category_mask(trace: Trace, *names: str) -> np.ndarray:
    """Rows whose normalized category is one of ``names``."""
    labels = trace.events.categories["cat"]
    codes = [labels.index(n) for n in names if n in labels]
    return _code_mask(trace.events["cat"], codes, len(labels))


def _code_mask(column: np.ndarray, codes: list[int], n_labels: int) -> np.ndarray:
    """``np.isin(column, codes)`` for label codes (-1 = none) as one table
    lookup: a run's worker builds dozens of these masks per trace, and isin
    sorts or allocates a table each time."""
    table = np.zeros(n_labels + 1, bool)  # the extra last entry is code -1's
    table[codes] = True
    return table[column]


def phase_mask(trace: Trace, ph: str) -> np.ndarray:
    """Rows of one Chrome-trace phase (``X`` complete, ``i`` instant, ...)."""
    labels = trace.events.categories["ph"]
    return trace.events["ph"] == (labels.index(ph) if ph in labels else -2)


def name_mask(trace: Trace, pattern: re.Pattern[str]) -> np.ndarray:
    """Rows whose name matches ``pattern`` (tested once per distinct name)."""
    labels = trace.events.categories["name"]
    hits = [i for i, lab in enumerate(labels) if pattern.search(lab)]
    return _code_mask(trace.events["name"], hits, len(labels))


def enclosing(ts: np.ndarray, dur: np.ndarray, group: np.ndarray,
              can_contain: np.ndarray) -> np.ndarray:
    """Index of the innermost interval enclosing each one, within its group.

    Defined by a sweep over intervals sorted by (group, start, longest first)
    with a stack of open intervals, popping those that ended at or before the
    next start; only rows with ``can_contain`` are pushed, so leaves such as
    runtime calls never parent anything. -1 where nothing encloses. Computed
    without the Python loop by ``open_before``.
    """
    n = len(ts)
    parent = np.full(n, -1, np.int64)
    if n == 0:
        return parent
    order = sweep_order(ts, dur, group)
    pos = open_before(ts[order], (ts + dur)[order], group[order], can_contain[order])
    parent[order] = np.where(pos >= 0, order[np.maximum(pos, 0)], -1)
    return parent


def sweep_order(ts: np.ndarray, dur: np.ndarray, group: np.ndarray) -> np.ndarray:
    """``np.lexsort((-dur, ts, group))``, faster on traces (mostly in time order).

    Sorting by start first is nearly linear on such data, only rows sharing a
    start are then ordered by duration, and the stable sort by group is a
    radix sort; ties keep row order at every stage, as in ``lexsort``.
    """
    order = np.argsort(ts, kind="stable")
    t = ts[order]
    tie = (t[1:] == t[:-1]) | (np.isnan(t[1:]) & np.isnan(t[:-1]))
    if tie.any():
        first = np.r_[True, ~tie]  # the first row of each run of equal starts
        in_run = np.r_[tie, False] | np.r_[False, tie]
        rows = np.flatnonzero(in_run)
        run = np.cumsum(first)[rows]
        order[rows] = order[rows][np.lexsort((-dur[order[rows]], run))]
    return order[np.argsort(group[order], kind="stable")]


def open_before(starts: np.ndarray, ends: np.ndarray, group: np.ndarray,
                can_contain: np.ndarray) -> np.ndarray:
    """For sorted intervals, the position of the sweep's stack top at each one.

    Inputs are sorted by (group, start); the result is what the stack sweep of
    ``enclosing`` would find on top when reaching each interval (-1: empty).
    The top is always the latest earlier container of the same group that has
    not ended by this start (``not end <= start``): every interval the sweep
    popped ended at or before an earlier start. That "last earlier element
    that is not skippable" is found for all rows at once by binary lifting
    over a table of block maxima of the ends (non-containers count as ended).
    """
    n = len(starts)
    if n == 0:
        return np.zeros(0, np.int64)
    ends = np.where(can_contain, ends, -np.inf)  # NaN ends stay open, as in the sweep
    group_start = np.searchsorted(group, group, side="left")
    pos = np.arange(-1, n - 1)
    # most rows end the search at once: the previous row is open, or another group
    todo = np.flatnonzero((pos >= group_start) & (ends[np.maximum(pos, 0)] <= starts))
    levels = [ends]
    longest = int((np.arange(n) - group_start).max()) + 1  # rows in the largest group
    while len(todo) and 2 ** len(levels) <= longest:
        prev, half = levels[-1], 2 ** (len(levels) - 1)  # max(ends[p - 2*half + 1 .. p])
        levels.append(np.concatenate([prev[:half], np.maximum(prev[half:], prev[:-half])]))
    at, floor, start = pos[todo], group_start[todo], starts[todo]
    for k in range(len(levels) - 1, -1, -1):
        step = 2**k
        ok = at - (step - 1) >= floor
        ok &= levels[k][np.maximum(at, 0)] <= start
        at = np.where(ok, at - step, at)
    pos[todo] = at
    found = pos >= group_start
    found &= ~(ends[np.maximum(pos, 0)] <= starts)
    return np.where(found, pos, -1)


def nesting_depths(trace: Trace, host_rows: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Host spans enclosing each chosen row on its thread (0 for GPU rows).

    Pointer jumping over the parent links (each round doubles the distance
    covered) rather than walking up one level at a time: spans that overlap
    without nesting chain up as deep as the trace is long.
    """
    ev = trace.events
    if len(host_rows) == 0:
        return np.zeros(len(chosen), np.int64)
    thread = ev["pid"][host_rows] * (1 << 32) + ev["tid"][host_rows]
    up = enclosing(ev["ts"][host_rows], np.nan_to_num(ev["dur"][host_rows]), thread,
                   np.ones(len(host_rows), bool))
    depth = (up >= 0).astype(np.int64)
    while (up >= 0).any():
        has = up >= 0
        safe = np.where(has, up, 0)
        depth = np.where(has, depth + depth[safe], depth)
        up = np.where(has, up[safe], -1)
    pos = np.minimum(np.searchsorted(host_rows, chosen), len(host_rows) - 1)
    return np.where(host_rows[pos] == chosen, depth[pos], 0)


def lookup(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``values`` at the position of each query in ``keys`` (-1 if absent or < 0)."""
    out = np.full(len(queries), -1, np.int64)
    valid = keys >= 0
    keys, values = keys[valid], values[valid]
    if len(keys) == 0 or len(queries) == 0:
        return out
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    pos = np.clip(np.searchsorted(sorted_keys, queries), 0, len(keys) - 1)
    hit = (sorted_keys[pos] == queries) & (queries >= 0)
    out[hit] = values[order[pos[hit]]]
    return out


def event_text(trace: Trace, column: str, row: int) -> str:
    """One row's text in a text column ("" where it has none)."""
    code = int(trace.events.at(column, row))
    return trace.events.categories[column][code] if code >= 0 else ""


#: The profiler's step markers, ``ProfilerStep#<N>``.
STEP_MARKER = re.compile(r"^ProfilerStep#(\d+)$")


def host_spans(trace: Trace) -> np.ndarray:
    """Mask of the host spans a timeline shows: complete ``cpu_op`` and
    ``user_annotation`` events, the ``ProfilerStep#N`` markers left out."""
    return (phase_mask(trace, "X") & category_mask(trace, "cpu_op", "user_annotation")
            & ~name_mask(trace, STEP_MARKER))


def unix_origin(trace: Trace) -> float:
    """Unix seconds at table ``ts == 0`` (see the module docstring)."""
    base = trace.meta.get("baseTimeNanoseconds")
    try:
        base_s = int(base) / 1e9 if base is not None else 0.0
    except (TypeError, ValueError):
        base_s = 0.0
    return base_s + float(trace.meta.get("t0_us", 0.0)) / 1e6
