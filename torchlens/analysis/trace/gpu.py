"""The GPU work of one rank's trace, classified and windowed as HTA does.

Definitions shared by every per-rank figure of this package:

- GPU work: complete events of the categories ``kernel``, ``gpu_memcpy`` and
  ``gpu_memset`` with a finite start and duration. HTA takes every event that
  carries a ``stream`` argument instead, which also counts ``cuda_sync``
  events (``Stream Sync``, ``Stream Wait Event``: waits, not work) and, in
  Triton traces, a host ``cpu_op``; we leave those out on purpose.
- Kind of a GPU event (HTA's ``get_kernel_type`` with the patterns of
  ``hta/common/types.py``, matched with ``re.match`` at the name's start):
  communication if the name matches ``^nccl``, ``^hip``, ``^hccl`` or
  ``.*ncclKernel``; else memory if it matches ``^(hip)?Memcpy``,
  ``^(hip)?Memset`` or ``^dma``; else compute unless it matches HTA's
  non-compute pattern (``NOT_COMPUTE``: NCCL, memcpy/memset, DMA, syncs,
  launch calls, MTIA/HCCL names); else other. One deliberate difference:
  ``gpu_memcpy`` / ``gpu_memset`` events are memory whatever their name (HTA
  would call a ROCm ``hipMemcpy...`` event communication through ``^hip``).
  HTA 0.5.0 on PyPI uses narrower patterns (``^nccl.*Kernel`` for
  communication); they agree on every shared trace.
- Window (HTA's ``_filter_irrelevant_gpu_kernels``, applied when it loads a
  trace): when the trace names at least two different ``ProfilerStep#N``, only
  GPU work launched before the last ``ProfilerStep#N`` started counts (with
  ``include_last_step``: launched at or before the last one ended), because
  the last step's device work may be cut off when profiling stops. "Launched"
  means a host event (any complete event that is not GPU work or a
  ``cuda_sync``) with the same ``correlation`` id started then; GPU work
  whose launch is not in the trace is dropped too. With fewer than two step
  names every GPU event counts. A capture's ``tail_step`` (the span after the
  last ``torchlens.step()``) is an ordinary ``ProfilerStep#N`` here, so it is
  the last step that HTA's rule leaves out.
- Lane: one GPU stream of one device, ``(device, stream)``. HTA keys streams
  by number alone, which joins equal stream numbers of different devices.
- Times are the events table's µs as floats. HTA rounds nanosecond traces to
  whole µs (start up, end down) unless ``HTA_DISABLE_NS_ROUNDING=1``; we do
  not round.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import numpy as np

from torchlens.analysis.trace.events import category_mask, name_mask, phase_mask
from torchlens.analysis.trace.steps import merge_intervals
from torchlens.model import Trace

#: Kinds of GPU work, in HTA's bit order for overlap states (compute = bit 0).
KINDS = ("compute", "communication", "memory", "other")
COMPUTE, COMMUNICATION, MEMORY, OTHER = range(len(KINDS))

#: HTA's ``CommunicateKernelGroupingPattern``.
COMMUNICATION_NAME = re.compile(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
#: HTA's ``MemoryKernelGroupingPattern``.
MEMORY_NAME = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
#: HTA's ``ComputeKernelGroupingPattern`` (inverse match: these are not compute).
NOT_COMPUTE = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(^Stream Wait Event)"
    r"|(cuda.*LaunchKernel)|(^runFunction)|(^hip)|(^job_exe)|(^packet)|(^pe_exe)"
    r"|(^cpum_exe_subgraph)|(^hccl)|(^collective_subgraph_execution)")
#: HTA's ``ProfilerStepGroupingPattern``.
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)")

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset")


def kind_of(name: str) -> int:
    """HTA's kernel type of a GPU event name (``KINDS`` index)."""
    if COMMUNICATION_NAME.match(name):
        return COMMUNICATION
    if MEMORY_NAME.match(name):
        return MEMORY
    if not NOT_COMPUTE.match(name):
        return COMPUTE
    return OTHER


@dataclass(frozen=True)
class GpuWork:
    """One trace's GPU work inside the window, sorted by (start, row).

    ``launch_ts`` is the start of the launching host event (NaN when the
    trace has none); ``lane`` indexes ``lanes``, the (device, stream) pairs in
    ascending order; ``name`` holds the events table's name codes.
    ``window`` says how the window was chosen: ``steps`` (distinct
    ``ProfilerStep#N`` names), ``applied`` (whether work was cut),
    ``gpu_events`` (all GPU work) and ``dropped`` (GPU work left out).
    """

    rows: np.ndarray
    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray
    name: np.ndarray
    lane: np.ndarray
    lanes: list[tuple[int, int]]
    launch_ts: np.ndarray
    window: dict

    def __len__(self) -> int:
        return len(self.rows)


def gpu_work(trace: Trace, include_last_step: bool = False) -> GpuWork:
    """The GPU work the figures read (see the module docstring).

    Selected once per trace and window: every per-rank figure (temporal,
    idle, overlap, kernels, launches, queues, bandwidth) reads the same
    selection, so a worker pays for it once. The memo goes with the trace
    and is ignored if its events table was replaced; treat the arrays as
    read-only.
    """
    key = (id(trace), include_last_step)
    hit = _WORK.get(key)
    if hit is not None and hit[0]() is trace and hit[1] is trace.events.columns:
        return hit[2]
    work = _gpu_work(trace, include_last_step)
    for value in vars(work).values():
        if isinstance(value, np.ndarray):
            value.flags.writeable = False  # shared by every reader of the memo
    weakref.finalize(trace, _WORK.pop, key, None)
    _WORK[key] = (weakref.ref(trace), trace.events.columns, work)
    return work


#: (id(trace), include_last_step) -> (weak reference to it, its columns, its GpuWork)
_WORK: dict[tuple[int, bool], tuple[weakref.ref, dict, GpuWork]] = {}


def _gpu_work(trace: Trace, include_last_step: bool) -> GpuWork:
    ev = trace.events
    x = phase_mask(trace, "X")
    gpu = x & category_mask(trace, *GPU_CATEGORIES)
    gpu &= np.isfinite(ev["ts"]) & np.isfinite(ev["dur"])
    rows = np.flatnonzero(gpu)
    host = x & ~category_mask(trace, *GPU_CATEGORIES, "cuda_sync")
    host &= ev["correlation"] >= 0
    launches = np.flatnonzero(host)
    launch_ts = _match(ev["correlation"][launches], ev["ts"][launches],
                       ev["correlation"][rows])

    steps = name_mask(trace, STEP_NAME) & x
    labels = trace.events.categories["name"]
    n_steps = len({labels[c] for c in np.unique(ev["name"][steps])})
    applied = n_steps >= 2
    if applied:
        if include_last_step:
            cut = float(np.nanmax(ev["ts"][steps] + ev["dur"][steps]))
            early = host & (ev["ts"] <= cut)
        else:
            cut = float(np.nanmax(ev["ts"][steps]))
            early = host & (ev["ts"] < cut)
        keep = np.isin(ev["correlation"][rows], ev["correlation"][early])
        rows, launch_ts = rows[keep], launch_ts[keep]
    window = {"steps": n_steps, "applied": applied, "gpu_events": int(gpu.sum()),
              "dropped": int(gpu.sum()) - len(rows)}

    start = ev["ts"][rows]
    order = np.argsort(start, kind="stable")
    rows, start, launch_ts = rows[order], start[order], launch_ts[order]
    end = start + ev["dur"][rows]
    name = ev["name"][rows]
    kind = _kinds(trace, name)
    kind[category_mask(trace, *MEMORY_CATEGORIES)[rows]] = MEMORY
    device, stream = ev["device"][rows], ev["stream"][rows]
    lanes: list[tuple[int, int]] = []
    lane = np.zeros(len(rows), np.int64)
    if len(rows):
        # one int per (device, stream), ordered as the pairs are
        low = int(stream.min())
        key = (device - int(device.min())) * (int(stream.max()) - low + 1) + (stream - low)
        _, first, lane = np.unique(key, return_index=True, return_inverse=True)
        lanes = [(int(d), int(s)) for d, s in zip(device[first], stream[first], strict=True)]
    return GpuWork(rows, start, end, kind, name, lane.reshape(-1), lanes, launch_ts, window)


def _kinds(trace: Trace, codes: np.ndarray) -> np.ndarray:
    """Kind of each name code, the regexes run once per distinct name."""
    labels = trace.events.categories["name"]
    distinct, inverse = np.unique(codes, return_inverse=True)
    table = np.array([kind_of(labels[c] if c >= 0 else "") for c in distinct], np.int64)
    return table[inverse.reshape(-1)] if len(codes) else np.zeros(0, np.int64)


def _match(keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """``values`` at each query's key in ``keys`` (the first row with it); NaN if absent."""
    out = np.full(len(queries), np.nan)
    if len(keys) == 0 or len(queries) == 0:
        return out
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    pos = np.clip(np.searchsorted(sorted_keys, queries), 0, len(keys) - 1)
    hit = sorted_keys[pos] == queries
    out[hit] = values[order[pos[hit]]]
    return out


def union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of intervals ``[start, end)``."""
    s, e = merge_intervals(start, end)
    return float((e - s).sum())


def state_times(work: GpuWork, kinds: tuple[int, ...]) -> np.ndarray:
    """µs in each overlap state of ``kinds``: entry ``m`` is the time when exactly
    the kinds of bitmask ``m`` (bit ``i`` = ``kinds[i]``) are running.

    HTA's sweep (``_get_gpu_kernel_type_time``, ``get_comm_comp_overlap``):
    each kind's intervals are merged into a union first, each union boundary
    adds or removes its kind's bit, and the time to the next boundary goes to
    the state reached. Entry 0 (nothing of ``kinds`` running) covers only the
    gaps between the first and last boundary.
    """
    times, deltas = [], []
    for bit, kind in enumerate(kinds):
        pick = work.kind == kind
        s, e = merge_intervals(work.start[pick], work.end[pick])
        times += [s, e]
        deltas += [np.full(len(s), 1 << bit), np.full(len(e), -(1 << bit))]
    t = np.concatenate(times)
    if len(t) < 2:
        return np.zeros(1 << len(kinds))
    order = np.argsort(t, kind="stable")
    t, state = t[order], np.cumsum(np.concatenate(deltas)[order])
    return np.bincount(state[:-1], weights=np.diff(t), minlength=1 << len(kinds))
