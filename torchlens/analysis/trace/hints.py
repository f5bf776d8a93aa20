"""Plain-language hints for known problems a trace shows, each with its figure.

A hint is only worth showing if the user can check it: every hint is a
``Finding`` titled with the problem, carrying the numbers that triggered it in
its ``figures`` (and saying them in its ``sentence``), with what to try in its
``advice``; thresholds are module constants so a report can quote them.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from torchlens.analysis.trace.events import (
    DEVICE_CATEGORIES,
    LAUNCH_CATEGORIES,
    category_mask,
    name_mask,
    phase_mask,
)
from torchlens.analysis.trace.steps import merge_intervals, step_rows
from torchlens.model import Trace
from torchlens.model.findings import INFO, WARNING, Figure, Finding
from torchlens.model.units import (
    format_duration,
    format_percent,
    format_us_as_ms,
    plural,
)

DATALOADER_SHARE = 0.05  # the TensorBoard plugin's own threshold
GPU_IDLE_SHARE = 0.30
DOMINANT_OP_SHARE = 0.50
_SYNC_RUNTIME = re.compile(
    r"^(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize"
    r"|hipStreamSynchronize|hipDeviceSynchronize|hipEventSynchronize)$")
_SCALAR_READ = re.compile(r"^aten::_local_scalar_dense$")  # what .item() runs
_ITEM = re.compile(r"^aten::item$")
_HOST_SYNC_KINDS = re.compile(r"^(Stream Sync|Event Sync|Context Sync|Device Sync)")
MIN_SELF_CPU_US = 1000.0  # below this, "dominant" is noise
SLOW_STEP_RATIO = 5.0  # a step this many times the median step is an outlier
MIN_STEPS_FOR_MEDIAN = 3  # fewer steps have no meaningful median to compare with


def find_hints(trace: Trace, ops: pd.DataFrame, steps: pd.DataFrame) -> list[Finding]:
    """All hints for one trace, most severe first.

    ``ops`` and ``steps`` are ``op_table(trace)`` and ``step_breakdown(trace)``
    (passed in because the caller has already computed them).
    """
    hints = [h for h in (
        _dataloader(steps),
        _gpu_idle(trace, steps),
        _syncs(trace),
        _slow_steps(steps),
        _dominant_op(ops),
    ) if h is not None]
    return sorted(hints, key=lambda h: h.severity != WARNING)


def has_gpu(trace: Trace) -> bool:
    """Whether the trace saw a GPU: device work, CUDA/HIP runtime calls or syncs.

    The GPU hints fire only then: a CPU-only trace has none of these.
    """
    return bool(category_mask(trace, *DEVICE_CATEGORIES, *LAUNCH_CATEGORIES,
                              "cuda_sync").any())


def _dataloader(steps: pd.DataFrame) -> Finding | None:
    if steps.empty or steps.dur_us.sum() <= 0:
        return None
    share = float(steps.dataloader_us.sum() / steps.dur_us.sum())
    if share < DATALOADER_SHARE:
        return None
    return Finding(
        WARNING if share >= 0.2 else INFO,
        f"DataLoader time is {format_percent(100 * share)} of step time over "
        f"{plural(len(steps), 'step')}.",
        (Figure("dataloader_share", share, "share"),
         Figure("dataloader_us", float(steps.dataloader_us.sum()), "µs"),
         Figure("steps", len(steps))),
        "Try DataLoader(num_workers=..., pin_memory=True, persistent_workers=True) "
        "or prefetching.",
        "Input pipeline takes a large share of each step", code="dataloader")


def _gpu_idle(trace: Trace, steps: pd.DataFrame) -> Finding | None:
    """GPU busy time within the steps (or the whole trace) and its largest gap."""
    ev = trace.events
    gpu = category_mask(trace, *DEVICE_CATEGORIES)
    if not gpu.any():
        return None
    if steps.empty:
        windows = np.array([[ev["ts"][gpu].min(), (ev["ts"] + ev["dur"])[gpu].max()]])
    else:
        windows = np.c_[steps.start_us, steps.start_us + steps.dur_us]
    s, e = merge_intervals(ev["ts"][gpu], (ev["ts"] + ev["dur"])[gpu])
    busy = sum(float(np.clip(np.minimum(e, w1) - np.maximum(s, w0), 0, None).sum())
               for w0, w1 in windows)
    span = float((windows[:, 1] - windows[:, 0]).sum())
    if span <= 0:
        return None
    idle = 1 - busy / span
    if idle < GPU_IDLE_SHARE:
        return None
    gaps = s[1:] - e[:-1]
    inside = (s[1:] > windows[0, 0]) & (e[:-1] < windows[-1, 1])
    largest = float(gaps[inside].max()) if inside.any() else 0.0
    return Finding(
        WARNING,
        f"The GPU is idle {format_percent(100 * idle)} of the "
        f"{'step' if not steps.empty else 'traced'} "
        f"time{f' (largest gap {format_duration(largest)})' if largest else ''}: "
        "the host does not launch work fast enough.",
        (Figure("gpu_idle_share", idle, "share"), Figure("gpu_busy_us", busy, "µs"),
         Figure("window_us", span, "µs"), Figure("largest_gap_us", largest, "µs")),
        "Look for Python overhead, syncs, or small kernels; try larger "
        "batches, CUDA graphs or torch.compile.",
        "GPU idle between launches", code="gpu_idle")


def _syncs(trace: Trace) -> Finding | None:
    """Host-device synchronizations inside the steps (anywhere if no steps).

    Only where the trace saw a GPU (``has_gpu``): without one, ``.item()``
    reads a CPU tensor and waits for nothing, so a hint about stalling "until
    the GPU catches up" would be false. Each sync is counted once: the runtime
    call (``cudaStreamSynchronize``...),
    or the GPU-side ``cuda_sync`` record when runtime calls were not traced
    (``Stream Wait Event`` is a device-side wait and does not block the host);
    and each ``.item()`` once, by its ``aten::_local_scalar_dense`` call.
    """
    ev = trace.events
    if not has_gpu(trace):
        return None
    x = phase_mask(trace, "X")
    runtime = x & category_mask(trace, "cuda_runtime") & name_mask(trace, _SYNC_RUNTIME)
    if not runtime.any():
        runtime = x & category_mask(trace, "cuda_sync") & name_mask(trace, _HOST_SYNC_KINDS)
    cpu_op = x & category_mask(trace, "cpu_op")
    reads = cpu_op & name_mask(trace, _SCALAR_READ)
    if not reads.any():
        reads = cpu_op & name_mask(trace, _ITEM)
    sync = runtime | reads
    rows = np.flatnonzero(sync)
    srows = step_rows(trace)
    if len(srows):
        s0, s1 = ev["ts"][srows], ev["ts"][srows] + ev["dur"][srows]
        k = np.searchsorted(s0, ev["ts"][rows], side="right") - 1
        rows = rows[(k >= 0) & (ev["ts"][rows] < s1[np.maximum(k, 0)])]
    if len(rows) == 0:
        return None
    names = pd.Series(ev.text("name")[rows])
    counts = names.value_counts()
    total = float(ev["dur"][rows].sum())
    where = f"inside {plural(len(srows), 'step')}" if len(srows) else "in the trace"
    top = ", ".join(f"{n} x{c}" for n, c in counts.head(3).items())
    return Finding(
        WARNING if len(srows) else INFO,
        f"{plural(len(rows), 'sync')} {where} ({top}), {format_duration(total)} of host time "
        "blocked.",
        (Figure("syncs", int(len(rows))), Figure("sync_us", total, "µs"),
         Figure("by_name", counts.to_dict())),
        ".item(), .cpu(), printing tensors and torch.cuda.synchronize() "
        "stall the CPU until the GPU catches up; keep values on the device or "
        "read them every N steps.",
        "Host-device synchronizations inside the loop", code="host_sync")


def _slow_steps(steps: pd.DataFrame) -> Finding | None:
    """Steps taking ``SLOW_STEP_RATIO`` times the median step or more, named.

    A first step is often the slow one (warm-up: lazy initialisation, cuDNN
    autotuning, torch.compile); later ones point at a periodic cost
    (checkpointing, logging, evaluation, a garbage collection).
    """
    if len(steps) < MIN_STEPS_FOR_MEDIAN:
        return None
    median = float(np.median(steps.dur_us))
    if median <= 0:
        return None
    slow = steps[steps.dur_us >= SLOW_STEP_RATIO * median]
    if slow.empty:
        return None
    worst = slow.loc[slow.dur_us.idxmax()]
    names = ", ".join(f"#{int(s)}" for s in slow.step.head(5))
    if len(slow) > 5:
        names += f" and {len(slow) - 5} more"
    first = int(steps.step.iloc[0]) in set(slow.step.astype(int))
    why = ("The first step often pays one-time costs (lazy initialisation, cuDNN "
           "autotuning, compilation): profile from a later step (--schedule) to "
           "see the steady state." if first else
           "Look in the timeline for what only that step does (checkpointing, "
           "evaluation, logging, garbage collection).")
    return Finding(
        WARNING,
        f"Step {names} took up to {worst.dur_us / median:.1f}x the median step "
        f"({format_us_as_ms(worst.dur_us)} against {format_us_as_ms(median)} over "
        f"{plural(len(steps), 'step')}).",
        (Figure("slow_steps", [int(s) for s in slow.step]), Figure("worst_step", int(worst.step)),
         Figure("worst_step_us", float(worst.dur_us), "µs"),
         Figure("median_step_us", median, "µs"),
         Figure("ratio", float(worst.dur_us / median), "x")),
        why, f"Slow {plural(len(slow), 'step')}: {names}", code="slow_steps")


def _dominant_op(ops: pd.DataFrame) -> Finding | None:
    if ops.empty or ops.self_cpu_us.sum() < MIN_SELF_CPU_US:
        return None
    by_name = ops.groupby("name")["self_cpu_us"].sum()
    share = float(by_name.max() / by_name.sum())
    if share <= DOMINANT_OP_SHARE:
        return None
    name = str(by_name.idxmax())
    return Finding(
        INFO,
        f"{name} accounts for {format_percent(100 * share)} of self CPU time "
        f"({format_duration(by_name.max())}).",
        (Figure("op", name), Figure("self_cpu_share", share, "share"),
         Figure("self_cpu_us", float(by_name.max()), "µs")),
        "Start with it: optimizing anything else cannot help much.",
        f"One op dominates CPU time: {name}", code="dominant_op")
