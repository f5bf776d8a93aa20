"""The run's tables of launch statistics, queue length and memory bandwidth,
from each rank's ``launches``, ``queues`` and ``memory_bw`` figures
(``rank_figures``; definitions in ``launches.py`` and ``counters.py``).

Input as ``run.py``: ``{rank: [figures of each of its traces]}``. A rank with
one trace (HTA's case) gets its figures as they are. Over several traces,
counts add up and count, mean, sample std, min and max are pooled exactly;
the 25/50/75 % cannot be rebuilt from per-trace summaries, so they are
``None`` then (never a guess). Ranks without GPU work give a ``launches``
row with ``gpu`` False and ``None`` figures, and no queue or bandwidth rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec

from torchlens.analysis.runs.launches import STAT_KEYS
from torchlens.analysis.runs.rows import (
    LaunchKernelRow,
    LaunchOutlierRow,
    LaunchRow,
    MemoryBwRow,
    QueueRow,
)
from torchlens.model.run_figures import (
    LaunchStats,
    MemoryBandwidth,
    QueueLength,
    RankFigures,
    Summary,
)

LAUNCH_TIMES = ("delay", "cpu", "gpu")
LAUNCH_COUNTS = ("launches", "gpu_shorter_than_cpu", "short_kernels", "runtime_outliers",
                 "delay_outliers")


def pooled(parts: Sequence[Summary | None]) -> Summary | None:
    """One summary from several (``launches.summary``'s, or a queue's or a
    memory kind's figures): count, mean, std, min and max exact; percentiles
    only when there is a single part."""
    have = [p for p in parts if p is not None and p.count]
    if not have:
        return None
    if len(have) == 1:
        one = have[0]
        return Summary(one.count, one.mean, one.std, one.min, one.p25, one.p50, one.p75,
                       one.max)
    n = sum(p.count or 0 for p in have)
    mean = sum((p.count or 0) * (p.mean or 0.0) for p in have) / n
    # sum of squared deviations from the pooled mean, part by part
    ss = sum(((p.count or 0) - 1) * (p.std or 0.0) ** 2
             + (p.count or 0) * ((p.mean or 0.0) - mean) ** 2 for p in have)
    return Summary(count=n, mean=mean, std=math.sqrt(ss / (n - 1)) if n > 1 else None,
                   min=min(p.min for p in have if p.min is not None),
                   max=max(p.max for p in have if p.max is not None))


def _flat(prefix: str, stats: Summary | None, unit: str = "") -> dict[str, float | None]:
    return {f"{prefix}_{k}{unit}": getattr(stats, k) if stats is not None else None
            for k in STAT_KEYS if k != "count"}


def launch_rows(ranks: RankFigures) -> list[LaunchRow]:
    """Per rank: launches, the summary of launch delay, launch call (cpu) and
    GPU durations (``delay_mean_us``, ``cpu_p50_us``...), the counts of GPU
    work shorter than its launch, short kernels and outliers, and the cutoffs."""
    rows = []
    for rank in sorted(ranks):
        parts = [f.launches or LaunchStats() for f in ranks[rank]]
        gpu = any(p.gpu for p in parts)
        counts = {}
        for key in LAUNCH_COUNTS:
            present = [getattr(p, key) for p in parts if getattr(p, key) is not None]
            counts[key] = sum(present) if present else None
        launches, shorter = counts["launches"], counts["gpu_shorter_than_cpu"]
        stats = {}
        for t in LAUNCH_TIMES:
            stats |= _flat(t, pooled([getattr(p, f"{t}_us") for p in parts]), "_us")
        cut = next((p.cutoffs for p in parts if p.cutoffs), None)
        apis: dict[str, int] = {}
        for p in parts:
            for api, n in (p.apis or {}).items():
                apis[api] = apis.get(api, 0) + n
        rows.append(LaunchRow(
            rank=rank, traces=len(parts), gpu=gpu, **counts,
            gpu_shorter_than_cpu_pct=(100.0 * shorter / launches
                                      if launches and shorter is not None else None),
            **stats, runtime_cutoff_us=cut.runtime_us if cut else None,
            launch_delay_cutoff_us=cut.launch_delay_us if cut else None, apis=apis or None))
    return rows


def launch_outlier_rows(ranks: RankFigures, top: int = 10) -> list[LaunchOutlierRow]:
    """Per rank: the ``top`` launches with the longest launch delay over its
    traces (each trace keeps its own top; ``trace`` says which)."""
    rows = []
    for rank in sorted(ranks):
        mine = [LaunchOutlierRow(rank=rank, trace=i, **msgspec.structs.asdict(o))
                for i, f in enumerate(ranks[rank])
                for o in (f.launches.outliers if f.launches else None) or []]
        mine.sort(key=lambda r: -r.delay_us)
        rows += mine[:top]
    return rows


def launch_kernel_rows(ranks: RankFigures) -> list[LaunchKernelRow]:
    """Per rank and GPU name (each trace's top names by total launch delay):
    count, total, mean and max delay, mean launch call and GPU time."""
    rows = []
    for rank in sorted(ranks):
        names: dict[str, LaunchKernelRow] = {}
        # per name: the launch call's and the GPU's time, summed
        cpu: dict[str, float] = {}
        gpu: dict[str, float] = {}
        for f in ranks[rank]:
            for k in (f.launches.by_name if f.launches else None) or []:
                name = k.name
                row = names.setdefault(name, LaunchKernelRow(rank, name))
                row.count += k.count
                row.delay_total_us += k.delay_total_us
                row.delay_max_us = max(row.delay_max_us, k.delay_max_us)
                cpu[name] = cpu.get(name, 0.0) + k.cpu_mean_us * k.count
                gpu[name] = gpu.get(name, 0.0) + k.gpu_mean_us * k.count
                row.gpu_shorter_than_cpu += k.gpu_shorter_than_cpu
        for row in sorted(names.values(), key=lambda r: -r.delay_total_us):
            n = row.count
            row.delay_mean_us = row.delay_total_us / n
            row.cpu_mean_us = cpu[row.name] / n
            row.gpu_mean_us = gpu[row.name] / n
            rows.append(row)
    return rows


def queue_rows(ranks: RankFigures) -> list[QueueRow]:
    """Per rank and stream: launches, the queue length summary (HTA's
    ``get_queue_length_summary``) and ``full_us``, the time at the full queue."""
    rows = []
    for rank in sorted(ranks):
        merged: dict[tuple[Any, Any], list[QueueLength]] = {}
        for f in ranks[rank]:
            for q in f.queues:
                merged.setdefault((q.device, q.stream), []).append(q)
        for (device, stream), parts in sorted(merged.items(), key=_lane_order):
            stats = pooled(parts)
            rows.append(QueueRow(
                rank=rank, device=device, stream=stream,
                launches=sum(p.launches or 0 for p in parts),
                **(msgspec.structs.asdict(stats) if stats is not None else {}),
                full_us=sum(p.full_us or 0.0 for p in parts),
                full_pct=parts[0].full_pct if len(parts) == 1 else None))
    return rows


def _lane_order(item: tuple[tuple[Any, Any], Any]) -> tuple[int, int]:
    device, stream = item[0]
    return (device if isinstance(device, int) else -1, stream if isinstance(stream, int) else -1)


def memory_bw_rows(ranks: RankFigures) -> list[MemoryBwRow]:
    """Per rank and memory kind (Memcpy HtoD, DtoH, DtoD, Memset...): events,
    bytes and the GB/s summary (HTA's ``get_memory_bw_summary``)."""
    rows = []
    for rank in sorted(ranks):
        merged: dict[str, list[MemoryBandwidth]] = {}
        for f in ranks[rank]:
            for b in f.memory_bw:
                merged.setdefault(str(b.kind), []).append(b)
        for kind, parts in sorted(merged.items()):
            stats = pooled(parts)
            rows.append(MemoryBwRow(
                rank=rank, kind=kind, events=sum(p.events or 0 for p in parts),
                bytes=sum(p.bytes or 0 for p in parts),
                **{f"{k}_GBps" if k != "count" else "count":
                   getattr(stats, k) if stats is not None else None for k in STAT_KEYS}))
    return rows
