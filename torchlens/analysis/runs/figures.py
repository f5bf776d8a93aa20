"""HTA's per-rank figures from one ``Trace``, as the structs of ``model.run_figures``.

Each figure follows HolisticTraceAnalysis (``hta/analyzers/breakdown_analysis.py``,
``communication_analysis.py``) on the GPU work that ``gpu.gpu_work`` selects
and classifies (HTA's window and kernel kinds; its docstring lists where that
differs from HTA). They work on the events table's numpy columns, so a rank is
summarised in a worker process and only the small result travels.

A trace without GPU work in the window (a CPU-only trace, or one whose GPU
work all falls after the last ``ProfilerStep#N``) has no GPU timeline: its
figures are ``None``, never 0, and ``idle_time`` is an empty list. HTA fails
on such a trace. Shares are percentages, not rounded (HTA rounds to 2
decimals); every time is in µs.
"""

from __future__ import annotations

import numpy as np

from torchlens.analysis.trace.gpu import (
    COMMUNICATION,
    COMPUTE,
    KINDS,
    MEMORY,
    GpuWork,
    gpu_work,
    state_times,
    union_length,
)
from torchlens.model import Trace
from torchlens.model.run_figures import (
    GpuWindow,
    IdleStream,
    KernelRest,
    Kernels,
    KernelStat,
    KernelState,
    KindTime,
    Overlap,
    Temporal,
    TopKernels,
    TraceFigures,
)

#: HTA's ``consecutive_kernel_delay`` default (its docstring says ns; the
#: trace's times, and so the threshold, are µs).
KERNEL_WAIT_US = 30.0
IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")
#: Kinds whose overlap states ``kernel_breakdown`` times (HTA with
#: ``include_memory_kernels=True``), in HTA's bit order.
STATE_KINDS = (COMPUTE, COMMUNICATION, MEMORY)


def temporal_breakdown(trace: Trace, include_last_step: bool = False) -> Temporal:
    """HTA's temporal breakdown of one rank's GPU timeline.

    - ``span_us``: from the first GPU work's start to the last one's end;
    - ``busy_us``: the union of all GPU work (all streams);
    - ``idle_us`` = span - busy;
    - ``compute_us``: the union of compute kernels;
    - ``non_compute_us`` = busy - compute: time when only communication,
      memory or other GPU work runs;
    - ``*_pct``: each of idle, compute and non-compute as a share of the span
      (``None`` when the span is 0).

    ``gpu`` says whether there is GPU work; ``window`` is ``GpuWork.window``.
    HTA's ``get_temporal_breakdown`` computes the same quantities (as
    ``kernel_time``, ``idle_time``, ``compute_time``, ``non_compute_time``),
    except that it counts ``cuda_sync`` events as busy non-compute time.
    """
    return _temporal(gpu_work(trace, include_last_step))


def idle_time(trace: Trace, include_last_step: bool = False,
              kernel_wait_us: float = KERNEL_WAIT_US) -> list[IdleStream]:
    """HTA's idle time breakdown, one row per GPU stream (``device``, ``stream``).

    On each stream, GPU work is taken in start order; the gap before each one
    but the first is its start minus the previous one's end (``idle_us`` sums
    them; a gap is negative if the two overlap, kept as HTA keeps it). A gap is

    - ``host_wait`` when the event's launch started after the previous event
      ended (the host had not enqueued it yet);
    - else ``kernel_wait`` when it is shorter than ``kernel_wait_us`` (the
      delay of launching back-to-back kernels);
    - else ``other`` (e.g. waiting on another stream's event).

    ``*_pct`` are shares of the stream's ``idle_us`` (``None`` when it is 0);
    ``events`` counts the stream's GPU work. One difference from HTA: work
    whose launch is not in the trace (only possible when no window applies) is
    never host wait; HTA then compares the time of the file's first event.
    Streams in (device, stream) order; an empty list without GPU work.
    """
    return _idle(gpu_work(trace, include_last_step), kernel_wait_us)


def comm_comp_overlap(trace: Trace, include_last_step: bool = False) -> Overlap:
    """HTA's communication/computation overlap of one rank.

    ``communication_us``: the union of communication kernels;
    ``overlapped_us``: the part of it during which a compute kernel also runs
    (the intersection of the two unions); ``overlap_pct`` = 100 * overlapped /
    communication (HTA's ``comp_comm_overlap_pctg``), ``None`` when the rank
    has no communication kernels (HTA gives NaN) or no GPU work.
    """
    return _overlap(gpu_work(trace, include_last_step))


def kernel_breakdown(trace: Trace, top: int = 10,
                     include_last_step: bool = False) -> Kernels:
    """Time by kind of GPU work, HTA's overlap states, and the top kernels.

    - ``kinds``: per kind (compute, communication, memory, other): ``us`` (sum
      of durations), ``count`` (events) and ``names`` (distinct names);
    - ``states``: HTA's kernel type breakdown (``get_gpu_kernel_breakdown``'s
      first table, with ``include_memory_kernels=True``): the time when exactly
      one combination of compute, communication and memory runs, e.g.
      ``"compute overlapping communication"``; ``pct`` is its share of all
      states' time (the union of those kinds). Largest first; states that
      never occur are left out. HTA truncates each piece of a state to whole
      µs (``astype(int)``), so on traces with fractional µs its state times
      run lower (e.g. 72540 vs 73350 µs of compute alone on
      a100_ddp_resnet_rank0_nccl); on whole-µs traces they are equal;
    - ``top``: per kind, ``kernels``: the ``top`` names by total time (ties by
      name) with ``count``, ``total_us``, ``mean_us``, ``min_us``, ``max_us``
      and ``std_us`` (sample standard deviation, 0 for one call, as HTA), and
      ``rest``: ``names``, ``count`` and ``total_us`` of the others (``None``
      when none are left). HTA also folds into "others" the names past the
      80th percentile of the cumulative time (``duration_ratio``); we cut by
      count only.

    ``None`` figures (``kinds``, ``states``, ``top``) without GPU work.
    """
    return _kernels(gpu_work(trace, include_last_step), trace, top)


def rank_figures(trace: Trace, top: int = 10, include_last_step: bool = False,
                 kernel_wait_us: float = KERNEL_WAIT_US) -> TraceFigures:
    """All figures of one rank, the GPU work selected once: ``temporal``,
    ``idle``, ``overlap``, ``kernels``, ``collective_overlap`` (``comm_overlap.py``:
    the overlap split by collective), and ``launches`` (``launches.py``),
    ``queues`` and ``memory_bw`` (``counters.py``)."""
    from torchlens.analysis.runs.counters import memory_bw_of_work, queues_of_work
    from torchlens.analysis.runs.launches import launch_stats_of_work
    from torchlens.analysis.trace.comm_overlap import overlap_of_work

    work = gpu_work(trace, include_last_step)
    return TraceFigures(temporal=_temporal(work), idle=_idle(work, kernel_wait_us),
                        overlap=_overlap(work), kernels=_kernels(work, trace, top),
                        collective_overlap=overlap_of_work(work, trace),
                        launches=launch_stats_of_work(trace, work, top),
                        queues=queues_of_work(trace, work),
                        memory_bw=memory_bw_of_work(trace, work))


# ------------------------------------------------------------------ internals
def _temporal(work: GpuWork) -> Temporal:
    window = GpuWindow(**work.window)
    if not len(work):
        return Temporal(gpu=False, window=window)
    span = float(work.end.max() - work.start.min())
    busy = union_length(work.start, work.end)
    pick = work.kind == COMPUTE
    compute = union_length(work.start[pick], work.end[pick])
    idle, non_compute = span - busy, busy - compute
    return Temporal(gpu=True, window=window, span_us=span, busy_us=busy, idle_us=idle,
                    compute_us=compute, non_compute_us=non_compute,
                    idle_pct=_share(idle, span), compute_pct=_share(compute, span),
                    non_compute_pct=_share(non_compute, span))


def _idle(work: GpuWork, kernel_wait_us: float) -> list[IdleStream]:
    if not len(work):
        return []
    order = np.argsort(work.lane, kind="stable")  # start order kept within a lane
    lane, start, end = work.lane[order], work.start[order], work.end[order]
    launch = work.launch_ts[order]
    has_prev = np.r_[False, lane[1:] == lane[:-1]]
    prev_end = np.r_[np.nan, end[:-1]]
    gap = start - prev_end
    host = launch > prev_end  # NaN (no launch, or the lane's first event) is False
    category = np.where(host, 0, np.where(gap < kernel_wait_us, 1, 2))
    n_lanes = len(work.lanes)
    sums = np.bincount(lane[has_prev] * 3 + category[has_prev], weights=gap[has_prev],
                       minlength=n_lanes * 3).reshape(n_lanes, 3)
    counts = np.bincount(lane, minlength=n_lanes)
    out = []
    for i, (device, stream) in enumerate(work.lanes):
        total = float(sums[i].sum())
        host, kernel, other = (float(sums[i, j]) for j in range(len(IDLE_CATEGORIES)))
        out.append(IdleStream(device=device, stream=stream, events=int(counts[i]),
                              idle_us=total, host_wait_us=host, kernel_wait_us=kernel,
                              other_us=other, host_wait_pct=_share(host, total),
                              kernel_wait_pct=_share(kernel, total),
                              other_pct=_share(other, total)))
    return out


def _overlap(work: GpuWork) -> Overlap:
    if not len(work):
        return Overlap(gpu=False)
    states = state_times(work, (COMMUNICATION, COMPUTE))
    comm = float(states[1] + states[3])
    overlapped = float(states[3])
    return Overlap(gpu=True, communication_us=comm, overlapped_us=overlapped,
                   overlap_pct=_share(overlapped, comm))


def _kernels(work: GpuWork, trace: Trace, top: int) -> Kernels:
    if not len(work):
        return Kernels(gpu=False)
    dur = work.end - work.start
    # one group per (kind, name code); names decoded once per group
    key = work.kind * (int(work.name.max()) + 2) + (work.name + 1)
    groups, first, group = np.unique(key, return_index=True, return_inverse=True)
    group = group.reshape(-1)
    n = np.bincount(group)
    total = np.bincount(group, weights=dur)
    mean = total / n
    sq = np.bincount(group, weights=(dur - mean[group]) ** 2)
    std = np.sqrt(np.divide(sq, n - 1, out=np.zeros(len(n)), where=n > 1))
    by_size = np.lexsort((dur, group))  # per group, shortest first
    bounds = np.cumsum(n)
    low, high = dur[by_size[bounds - n]], dur[by_size[bounds - 1]]
    labels = trace.events.categories["name"]
    codes = work.name[first]
    names = [labels[c] if c >= 0 else "" for c in codes]
    g_kind = work.kind[first]

    kinds: dict[str, KindTime] = {}
    top_out: dict[str, TopKernels] = {}
    for k, word in enumerate(KINDS):
        mine = sorted(np.flatnonzero(g_kind == k).tolist(), key=lambda g: (-total[g], names[g]))
        kinds[word] = KindTime(us=float(total[mine].sum()), count=int(n[mine].sum()),
                               names=len(mine))
        shown, rest = mine[:top], mine[top:]
        top_out[word] = TopKernels(
            kernels=[KernelStat(name=names[g], count=int(n[g]), total_us=float(total[g]),
                                mean_us=float(mean[g]), min_us=float(low[g]),
                                max_us=float(high[g]), std_us=float(std[g]))
                     for g in shown],
            rest=(KernelRest(names=len(rest), count=int(n[rest].sum()),
                             total_us=float(total[rest].sum())) if rest else None))
    times = state_times(work, STATE_KINDS)
    whole = float(times[1:].sum())
    states = [KernelState(state=" overlapping ".join(KINDS[STATE_KINDS[b]] for b in range(3)
                                                     if m >> b & 1),
                          us=float(times[m]), pct=_share(float(times[m]), whole))
              for m in range(1, len(times)) if times[m] > 0]
    states.sort(key=lambda s: -s.us)
    return Kernels(gpu=True, kinds=kinds, states=states, top=top_out)


def _share(part: float, whole: float) -> float | None:
    """``100 * part / whole``; ``None`` when ``whole`` is 0."""
    return 100.0 * part / whole if whole else None
