"""Queue length per GPU stream and memcpy/memset bandwidth of one rank
(HTA's ``trace_counters.py``: ``get_queue_length_summary``,
``get_time_spent_blocked_on_full_queue``, ``get_memory_bw_summary``).

Queue length of a stream: the number of operations launched on it that
have not started yet. Each launch pair (``launches.launch_pairs``: GPU work
in HTA's window and its launch call of ``LAUNCH_NAMES``) adds 1 at the launch
call's start and removes 1 at the GPU event's start. The series has one
point per change; as HTA does, the summary (count, mean, sample std, min,
25/50/75 %, max) is over those points, not weighted by time, so ``count`` is
twice the stream's launches. At equal times removals come first: HTA sorts
additions and removals with an unstable sort, so its order at ties is not
defined; removals first gives HTA's figures on the shared whole-µs trace
(a100_simple_add), and the two orders differ by < 0.001 % of the mean on the
others.
``full_us``: time spent with the queue at or above ``MAX_QUEUE`` (CUDA's
1024 pending launches per stream, HTA's ``CUDA_MAX_LAUNCH_QUEUE_PER_STREAM``),
each point's value held until the stream's next point; ``full_pct`` is its
share of the rank's trace (first to last event start, HTA's
``get_trace_duration``). HTA lists only streams that reached the limit
(keeping one per rank); we give ``full_us`` = 0 for every stream.

Memory bandwidth: per memory kind (HTA's ``get_memory_kernel_type``:
``Memset`` for names starting so, ``Memcpy XtoY`` from the name's first 11
characters, else ``Memcpy Unknown``), a step series of GB/s: each memcpy or
memset adds its bandwidth at its start and removes it at its end (a 0 µs
event counts as 1 µs, as HTA), so concurrent copies of one kind add up;
summary statistics of the series' points above 0 (starts before ends at equal
times). One difference: the bandwidth of an event is ``bytes / duration``
from the trace (GB/s = bytes per ns), where HTA reads Kineto's ``memory
bandwidth (GB/s)`` argument, which Kineto computes from the nanosecond
duration. Equal where the trace keeps ns durations (e.g. ``dur: 4.96``); a
trace with whole-µs durations (``dur: 2.0`` for 2.048 µs) gives up to a few
% more here. Memory events without ``bytes`` (ROCm traces) are left out
(HTA: no bandwidth, also left out). Only ``gpu_memcpy``/``gpu_memset``
events and names HTA calls memory count (``gpu.gpu_work``'s memory kind).
"""

from __future__ import annotations

import msgspec
import numpy as np

from torchlens.analysis.runs.launches import launch_pairs, summary
from torchlens.analysis.trace.events import LAUNCH_NAMES
from torchlens.analysis.trace.gpu import MEMORY, GpuWork, gpu_work
from torchlens.model import Trace
from torchlens.model.run_figures import MemoryBandwidth, QueueLength, Summary

#: CUDA's launch queue limit per stream (HTA's ``CUDA_MAX_LAUNCH_QUEUE_PER_STREAM``).
MAX_QUEUE = 1024


def queue_length(trace: Trace, include_last_step: bool = False,
                 max_queue: int = MAX_QUEUE) -> list[QueueLength]:
    """Per GPU stream (``device``, ``stream``): the queue length summary and
    the time at the full queue (module docstring). Empty without launches."""
    return queues_of_work(trace, gpu_work(trace, include_last_step), max_queue)


def memory_bandwidth(trace: Trace, include_last_step: bool = False) -> list[MemoryBandwidth]:
    """Per memory kind: ``events``, ``bytes`` and the GB/s series summary
    (module docstring). Empty without memory events that carry ``bytes``."""
    return memory_bw_of_work(trace, gpu_work(trace, include_last_step))


def _trace_span(trace: Trace) -> float | None:
    ts = trace.events["ts"]
    ts = ts[np.isfinite(ts)]
    return float(ts.max() - ts.min()) if len(ts) else None


def queues_of_work(trace: Trace, work: GpuWork, max_queue: int = MAX_QUEUE) -> list[QueueLength]:
    pairs = launch_pairs(trace, work, LAUNCH_NAMES)
    if not len(pairs):
        return []
    lane = work.lane[pairs.work]
    t = np.concatenate([pairs.cpu_ts, work.start[pairs.work]])
    step = np.concatenate([np.ones(len(pairs), np.int64), -np.ones(len(pairs), np.int64)])
    lanes = np.concatenate([lane, lane])
    # by lane, then time, additions before removals at equal times
    order = np.lexsort((step, t, lanes))
    t, step, lanes = t[order], step[order], lanes[order]
    first = np.r_[True, lanes[1:] != lanes[:-1]]
    starts = np.flatnonzero(first)
    csum = np.cumsum(step)
    # restart the running sum at each lane's first point
    base = np.repeat(csum[starts] - step[starts], np.diff(np.r_[starts, len(t)]))
    length = csum - base
    held = np.r_[np.diff(t), np.nan]
    held[np.r_[starts[1:] - 1, len(t) - 1]] = np.nan  # a lane's last point has no end
    span = _trace_span(trace)
    out = []
    for i, s in enumerate(starts.tolist()):
        e = starts[i + 1] if i + 1 < len(starts) else len(t)
        q = length[s:e]
        h = held[s:e]
        full = float(np.nansum(h[q >= max_queue]))
        device, stream = work.lanes[int(lanes[s])]
        stats = summary(q) or Summary()  # never empty: a lane here has two points per launch
        out.append(QueueLength(**msgspec.structs.asdict(stats), device=device, stream=stream,
                               launches=int(e - s) // 2, full_us=full,
                               full_pct=100.0 * full / span if span else None))
    return out


def memory_kind(name: str) -> str:
    """HTA's ``get_memory_kernel_type``: ``Memset``, ``Memcpy XtoY`` or ``Memcpy Unknown``."""
    if name.startswith("Memset"):
        return "Memset"
    if not name.startswith("Memcpy"):
        return "Memcpy Unknown"
    return name[:11]


def memory_bw_of_work(trace: Trace, work: GpuWork) -> list[MemoryBandwidth]:
    ev = trace.events
    pick = np.flatnonzero(work.kind == MEMORY)
    nbytes = ev["bytes"][work.rows[pick]]
    pick, nbytes = pick[nbytes >= 0], nbytes[nbytes >= 0]
    if not len(pick):
        return []
    labels = ev.categories["name"]
    start = work.start[pick]
    dur = work.end[pick] - start
    dur = np.where(dur == 0, 1.0, dur)
    gbps = nbytes / (dur * 1000.0)
    codes = work.name[pick]
    distinct, inverse = np.unique(codes, return_inverse=True)
    kinds = [memory_kind(labels[c] if c >= 0 else "") for c in distinct]
    out = []
    for kind in sorted(set(kinds)):
        mine = np.isin(inverse.reshape(-1), [i for i, k in enumerate(kinds) if k == kind])
        s, d, bw = start[mine], dur[mine], gbps[mine]
        t = np.concatenate([s, s + d])
        delta = np.concatenate([bw, -bw])
        is_end = np.r_[np.zeros(len(s), bool), np.ones(len(s), bool)]
        order = np.lexsort((is_end, t))
        level = np.cumsum(delta[order])
        # the running sum of floats leaves ~1e-13 where it should be 0; HTA counts
        # such points as > 0, we treat anything below 1e-9 of the largest as 0
        points = level[level > 1e-9 * float(np.abs(bw).max())]
        stats = summary(points) or Summary()
        out.append(MemoryBandwidth(**msgspec.structs.asdict(stats), kind=kind,
                                   events=int(mine.sum()), bytes=int(nbytes[mine].sum())))
    return out
