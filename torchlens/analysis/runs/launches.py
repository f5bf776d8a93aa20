"""CUDA kernel launch statistics of one rank (HTA's ``get_cuda_kernel_launch_stats``).

Every GPU event (``gpu.gpu_work``: kernels, memcpy and memset inside HTA's
window) is paired with the host runtime call that launched it: a complete
host event whose name is a launch API (``LAUNCH_NAMES``) with the same
``correlation`` id (> 0). For each pair:

- ``cpu_us``: the launch call's duration;
- ``gpu_us``: the GPU event's duration;
- ``delay_us`` (launch delay): the GPU event's start minus the launch call's
  end, clipped at 0 (HTA clips too: a negative gap is clock noise).

Counted with HTA's default cutoffs (``RUNTIME_CUTOFF_US`` = 50 µs,
``LAUNCH_DELAY_CUTOFF_US`` = 100 µs; HTA's plots use them):

- ``gpu_shorter_than_cpu``: pairs whose GPU time is shorter than the launch
  call (the GPU finishes faster than the CPU can feed it);
- ``short_kernels``: HTA's "short GPU kernels": GPU time < launch call time
  *and* launch call <= the runtime cutoff;
- ``runtime_outliers``: launch calls longer than the runtime cutoff;
- ``delay_outliers``: launch delays longer than the launch delay cutoff.

The per-pair rows can be millions, so a rank keeps a bounded summary:
count, mean, sample std, min, 25/50/75 % (linear interpolation, as pandas'
``describe``) and max of each of the three times, the counts above, the
``top`` pairs with the longest launch delay and the ``top`` GPU names by total
launch delay.

Where this differs from HTA 0.5.0:

- the launch APIs: HTA's launch statistics take ``cudaLaunchKernel``,
  ``cudaLaunchKernelExC``, MTIA's ``runFunction``, ``cudaMemcpyAsync`` and
  ``cudaMemsetAsync`` only, so a Triton (``cuLaunchKernel``/``cuLaunchKernelEx``),
  CUDA graph (``cudaGraphLaunch``), cooperative or ROCm (``hipLaunchKernel``...)
  launch gets no row there; we take ``analysis.trace.events.LAUNCH_NAMES``, the
  one list of launch calls (Kineto's launch flows and HTA's queue-length set).
  ``HTA_LAUNCH_STATS_NAMES`` gives HTA's set to ``launch_stats(names=...)``;
- GPU work: only kernel, memcpy and memset events (``gpu.gpu_work``); HTA
  pairs any event with a stream;
- times are not rounded; HTA rounds nanosecond traces to whole µs (start up,
  end down) unless ``HTA_DISABLE_NS_ROUNDING=1``, which moves µs-short
  launch calls and kernels by up to 1 µs each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from torchlens.analysis.trace.events import LAUNCH_NAMES, category_mask, phase_mask
from torchlens.analysis.trace.gpu import GPU_CATEGORIES, GpuWork, gpu_work
from torchlens.model import Trace
from torchlens.model.run_figures import (
    Cutoffs,
    LaunchOutlier,
    LaunchStats,
    NameLaunches,
    Summary,
)

#: The narrower set of HTA 0.5.0's ``cuda_kernel_launch_stats``.
HTA_LAUNCH_STATS_NAMES = (
    "cudaLaunchKernel", "cudaLaunchKernelExC",
    "runFunction - job_prep_and_submit_for_execution", "cudaMemcpyAsync", "cudaMemsetAsync",
)
#: HTA's default ``runtime_cutoff`` (µs): a launch call longer than this is an outlier.
RUNTIME_CUTOFF_US = 50.0
#: HTA's default ``launch_delay_cutoff`` (µs).
LAUNCH_DELAY_CUTOFF_US = 100.0
#: Longest kernel name kept in ``outliers`` and ``by_name`` (cut with "…").
MAX_NAME = 160
STAT_KEYS = ("count", "mean", "std", "min", "p25", "p50", "p75", "max")


@dataclass(frozen=True)
class Launches:
    """GPU work paired with its launch call: ``work`` indexes ``GpuWork``'s
    arrays; ``cpu_ts``/``cpu_dur`` are the launch call's start and duration,
    ``api`` its name code."""

    work: np.ndarray
    cpu_ts: np.ndarray
    cpu_dur: np.ndarray
    api: np.ndarray

    def __len__(self) -> int:
        return len(self.work)


def launch_pairs(trace: Trace, work: GpuWork,
                 names: tuple[str, ...] = LAUNCH_NAMES) -> Launches:
    """Pair each GPU event of ``work`` with its launch call (see the module docstring).

    A GPU event whose correlation id no launch call of ``names`` carries is
    left out (HTA's inner join); when several calls carry it, the first row wins.
    """
    ev = trace.events
    labels = ev.categories["name"]
    codes = [i for i, lab in enumerate(labels) if lab in set(names)]
    host = phase_mask(trace, "X") & ~category_mask(trace, *GPU_CATEGORIES, "cuda_sync")
    host &= np.isin(ev["name"], codes) & (ev["correlation"] > 0)
    host &= np.isfinite(ev["ts"]) & np.isfinite(ev["dur"])
    calls = np.flatnonzero(host)
    empty = Launches(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0, np.int64))
    if not len(calls) or not len(work):
        return empty
    corr = ev["correlation"][calls]
    order = np.argsort(corr, kind="stable")
    sorted_corr = corr[order]
    wanted = ev["correlation"][work.rows]
    pos = np.clip(np.searchsorted(sorted_corr, wanted), 0, len(calls) - 1)
    hit = sorted_corr[pos] == wanted
    call = calls[order[pos[hit]]]
    return Launches(np.flatnonzero(hit), ev["ts"][call], ev["dur"][call], ev["name"][call])


def summary(values: np.ndarray) -> Summary | None:
    """count, mean, sample std, min, 25/50/75 % and max (pandas' ``describe``);
    ``None`` for no values; std is ``None`` for one value (pandas gives NaN)."""
    v = np.asarray(values, float)
    if not len(v):
        return None
    p25, p50, p75 = np.percentile(v, [25, 50, 75])
    return Summary(count=int(len(v)), mean=float(v.mean()),
                   std=float(v.std(ddof=1)) if len(v) > 1 else None,
                   min=float(v.min()), p25=float(p25), p50=float(p50),
                   p75=float(p75), max=float(v.max()))


def launch_stats(trace: Trace, top: int = 10, include_last_step: bool = False,
                 names: tuple[str, ...] = LAUNCH_NAMES,
                 runtime_cutoff_us: float = RUNTIME_CUTOFF_US,
                 launch_delay_cutoff_us: float = LAUNCH_DELAY_CUTOFF_US) -> LaunchStats:
    """One rank's launch statistics (the module docstring defines each figure)."""
    return launch_stats_of_work(trace, gpu_work(trace, include_last_step), top, names,
                         runtime_cutoff_us, launch_delay_cutoff_us)


def launch_stats_of_work(trace: Trace, work: GpuWork, top: int = 10,
                  names: tuple[str, ...] = LAUNCH_NAMES,
                  runtime_cutoff_us: float = RUNTIME_CUTOFF_US,
                  launch_delay_cutoff_us: float = LAUNCH_DELAY_CUTOFF_US) -> LaunchStats:
    cutoffs = Cutoffs(runtime_us=runtime_cutoff_us, launch_delay_us=launch_delay_cutoff_us)
    if not len(work):
        return LaunchStats(gpu=False, cutoffs=cutoffs)
    pairs = launch_pairs(trace, work, names)
    labels = trace.events.categories["name"]
    gpu_start = work.start[pairs.work]
    gpu_dur = work.end[pairs.work] - gpu_start
    cpu_dur = pairs.cpu_dur
    delay = np.maximum(gpu_start - pairs.cpu_ts - cpu_dur, 0.0)
    shorter = gpu_dur < cpu_dur
    api_codes, api_n = np.unique(pairs.api, return_counts=True)
    out = LaunchStats(
        gpu=True, cutoffs=cutoffs, launches=len(pairs),
        apis={labels[c]: int(n) for c, n in zip(api_codes, api_n, strict=True)},
        cpu_us=summary(cpu_dur), gpu_us=summary(gpu_dur), delay_us=summary(delay),
        gpu_shorter_than_cpu=int(shorter.sum()),
        gpu_shorter_than_cpu_pct=100.0 * float(shorter.mean()) if len(pairs) else None,
        short_kernels=int((shorter & (cpu_dur <= runtime_cutoff_us)).sum()),
        runtime_outliers=int((cpu_dur > runtime_cutoff_us).sum()),
        delay_outliers=int((delay > launch_delay_cutoff_us).sum()))
    gpu_name = work.name[pairs.work]

    def label(code: int) -> str:
        # kernel names can be kB-long templates: keep a rank's figure a few kB
        text = labels[code] if code >= 0 else ""
        return text if len(text) <= MAX_NAME else text[:MAX_NAME - 1] + "…"

    worst = np.lexsort((gpu_start, -delay))[:top]
    out.outliers = [LaunchOutlier(name=label(int(gpu_name[i])), api=label(int(pairs.api[i])),
                                  ts_us=float(gpu_start[i]), cpu_us=float(cpu_dur[i]),
                                  gpu_us=float(gpu_dur[i]), delay_us=float(delay[i]))
                    for i in worst.tolist()]
    out.by_name = _by_name(gpu_name, cpu_dur, gpu_dur, delay, shorter, top, label)
    return out


def _by_name(name: np.ndarray, cpu: np.ndarray, gpu: np.ndarray, delay: np.ndarray,
             shorter: np.ndarray, top: int, label: Any) -> list[NameLaunches]:
    """The ``top`` GPU names by total launch delay (ties by name)."""
    if not len(name):
        return []
    codes, group = np.unique(name, return_inverse=True)
    group = group.reshape(-1)
    n = np.bincount(group)

    def total(w: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=w)

    delay_sum, cpu_sum, gpu_sum = total(delay), total(cpu), total(gpu)
    short = np.bincount(group, weights=shorter.astype(float))
    high = np.full(len(codes), -np.inf)
    np.maximum.at(high, group, delay)
    names = [label(int(c)) for c in codes]
    picked = sorted(range(len(codes)), key=lambda g: (-delay_sum[g], names[g]))[:top]
    return [NameLaunches(name=names[g], count=int(n[g]), delay_total_us=float(delay_sum[g]),
                         delay_mean_us=float(delay_sum[g] / n[g]), delay_max_us=float(high[g]),
                         cpu_mean_us=float(cpu_sum[g] / n[g]),
                         gpu_mean_us=float(gpu_sum[g] / n[g]),
                         gpu_shorter_than_cpu=int(short[g])) for g in picked]
