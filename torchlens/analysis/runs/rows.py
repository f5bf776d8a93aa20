"""The rows of a run's tables (``analyze.RunAnalysis``), one struct per table.

Every field is named here with its type, so a reader (and the type checker)
knows what a row holds. The analysis builds them; the views read their
fields; ``rows_json`` turns a table into the list of dicts that ``--json``
prints and a DataFrame is built from (one point, ``frontends.runs.api``).

A figure that could not be measured is ``None`` here (``null`` in JSON, NaN
in a DataFrame, ``model.units.MISSING`` in a text view). A field that is
``UNSET`` is not in the row's JSON at all: the keys a table only has on some
rows (``caused_each_us`` of a rank that never arrived last, the ``*_raw``
keys before clocks are aligned) keep that shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

#: a rank's stream or device as the trace names it (a number, or a label)
Lane = int | str | None


class TemporalRow(msgspec.Struct):
    """Per rank: HTA's temporal breakdown summed over its traces."""

    rank: int
    traces: int
    gpu: bool
    span_us: float | None = None
    busy_us: float | None = None
    idle_us: float | None = None
    compute_us: float | None = None
    non_compute_us: float | None = None
    idle_pct: float | None = None
    compute_pct: float | None = None
    non_compute_pct: float | None = None


class IdleRow(msgspec.Struct):
    """Per rank and stream: idle µs as host wait, kernel wait and other."""

    rank: int
    device: Lane
    stream: Lane
    events: int = 0
    idle_us: float = 0.0
    host_wait_us: float = 0.0
    kernel_wait_us: float = 0.0
    other_us: float = 0.0
    host_wait_pct: float | None = None
    kernel_wait_pct: float | None = None
    other_pct: float | None = None


class OverlapRow(msgspec.Struct):
    """Per rank: communication µs and the part compute overlapped."""

    rank: int
    communication_us: float | None
    overlapped_us: float | None
    overlap_pct: float | None


class CollectiveOverlapRow(msgspec.Struct):
    """Per rank and collective: overlapped and exposed communication."""

    rank: int
    collective: str
    communication_us: float
    overlapped_us: float | None
    exposed_us: float
    overlap_pct: float | None
    exposed_pct: float | None


class KernelRow(msgspec.Struct):
    """Per rank and kernel kind: µs, count and share."""

    rank: int
    kind: str
    us: float = 0.0
    count: int = 0
    pct: float | None = None


class TopKernelRow(msgspec.Struct):
    """Per rank, kind and kernel name: count and total µs."""

    rank: int
    kind: str
    name: str
    count: int = 0
    total_us: float = 0.0


class StepRow(msgspec.Struct):
    """Per rank and ``ProfilerStep#N``: the ``%%torchprof`` step breakdown (µs per role)."""

    rank: int
    step: int
    start_us: float = 0.0
    dur_us: float = 0.0
    kernel_us: float = 0.0
    memcpy_us: float = 0.0
    memset_us: float = 0.0
    runtime_us: float = 0.0
    dataloader_us: float = 0.0
    cpu_exec_us: float = 0.0
    other_us: float = 0.0
    comm_us: float = 0.0

    def role_us(self, role: str) -> float:
        """The µs of one role (``kernel``, ``dataloader`` ...)."""
        return float(getattr(self, f"{role}_us"))


class StepSkewRow(msgspec.Struct):
    """Per step number every rank has: the median and longest step time."""

    step: int
    ranks: int
    median_us: float
    max_us: float
    longest_rank: int
    skew_pct: float | None


class StragglerRow(msgspec.Struct):
    """Per rank: how often it arrived last and the wait it caused and suffered,
    with its likely cause (``causes.with_causes``)."""

    rank: int
    collectives: int = 0
    last: int = 0
    last_pct: float | None = None
    caused_us: float = 0.0
    caused_mean_us: float | None = None
    waited_us: float = 0.0
    #: only on a rank that arrived last (or the verdict's rank, as None)
    caused_each_us: float | None | UnsetType = UNSET
    cause: str | None | UnsetType = UNSET
    cause_us: float | None | UnsetType = UNSET
    cause_others_us: float | None | UnsetType = UNSET
    cause_words: str | None | UnsetType = UNSET
    wait_per_step_us: float | None | UnsetType = UNSET


class CollectiveRow(msgspec.Struct):
    """One collective matched across ranks by ``(trace, seq)`` (``collectives.collective_rows``)."""

    trace: int
    step: int | None
    seq: int
    name: str | None
    mismatch: str | None
    ranks: int
    missing: list[int]
    bytes: int | None = None
    n: int | None = None
    arrivals: dict[int, float] | None = None
    arrived_by: str | None = None
    issued: dict[int, float] | None = None
    last_rank: int | None = None
    waits_us: dict[int, float] | None = None
    max_wait_us: float | None = None
    total_wait_us: float | None = None
    dur_us: float | None = None
    timed_by: str | None = None
    span_us: float | None = None
    algbw_GBps: float | None = None
    busbw_GBps: float | None = None
    #: set by ``clock.align_rows``: the arrivals before clocks were aligned
    arrivals_raw: dict[int, float] | None | UnsetType = UNSET
    last_rank_raw: int | None | UnsetType = UNSET
    waits_raw_us: dict[int, float] | None | UnsetType = UNSET
    max_wait_raw_us: float | None | UnsetType = UNSET
    aligned: bool | UnsetType = UNSET


class ClockRow(msgspec.Struct):
    """Per rank with collectives: its clock's offset to the reference rank's."""

    rank: int
    reference: int
    offset_us: float | None
    collectives: int
    residual_median_us: float | None
    residual_max_us: float | None
    applied: bool
    host: str | None


class LaunchRow(msgspec.Struct):
    """Per rank: CUDA kernel launch statistics (``launch_tables.launch_rows``)."""

    rank: int
    traces: int
    gpu: bool
    launches: int | None = None
    gpu_shorter_than_cpu: int | None = None
    short_kernels: int | None = None
    runtime_outliers: int | None = None
    delay_outliers: int | None = None
    gpu_shorter_than_cpu_pct: float | None = None
    delay_mean_us: float | None = None
    delay_std_us: float | None = None
    delay_min_us: float | None = None
    delay_p25_us: float | None = None
    delay_p50_us: float | None = None
    delay_p75_us: float | None = None
    delay_max_us: float | None = None
    cpu_mean_us: float | None = None
    cpu_std_us: float | None = None
    cpu_min_us: float | None = None
    cpu_p25_us: float | None = None
    cpu_p50_us: float | None = None
    cpu_p75_us: float | None = None
    cpu_max_us: float | None = None
    gpu_mean_us: float | None = None
    gpu_std_us: float | None = None
    gpu_min_us: float | None = None
    gpu_p25_us: float | None = None
    gpu_p50_us: float | None = None
    gpu_p75_us: float | None = None
    gpu_max_us: float | None = None
    runtime_cutoff_us: float | None = None
    launch_delay_cutoff_us: float | None = None
    apis: dict[str, int] | None = None


class LaunchOutlierRow(msgspec.Struct):
    """Per rank: one launch with a long launch delay."""

    rank: int
    trace: int
    name: str
    api: str
    ts_us: float
    cpu_us: float
    gpu_us: float
    delay_us: float


class LaunchKernelRow(msgspec.Struct):
    """Per rank and GPU name: launch delay and launch call vs GPU time."""

    rank: int
    name: str
    count: int = 0
    delay_total_us: float = 0.0
    delay_max_us: float = 0.0
    gpu_shorter_than_cpu: int = 0
    delay_mean_us: float = 0.0
    cpu_mean_us: float = 0.0
    gpu_mean_us: float = 0.0


class QueueRow(msgspec.Struct):
    """Per rank and GPU stream: the queue length summary and time at the full queue."""

    rank: int
    device: Lane
    stream: Lane
    launches: int
    count: int | UnsetType = UNSET
    mean: float | None | UnsetType = UNSET
    std: float | None | UnsetType = UNSET
    min: float | None | UnsetType = UNSET
    p25: float | None | UnsetType = UNSET
    p50: float | None | UnsetType = UNSET
    p75: float | None | UnsetType = UNSET
    max: float | None | UnsetType = UNSET
    full_us: float = 0.0
    full_pct: float | None = None


class MemoryBwRow(msgspec.Struct):
    """Per rank and memory kind: events, bytes and the GB/s summary."""

    rank: int
    kind: str
    events: int
    bytes: int
    count: int | None = None
    mean_GBps: float | None = None
    std_GBps: float | None = None
    min_GBps: float | None = None
    p25_GBps: float | None = None
    p50_GBps: float | None = None
    p75_GBps: float | None = None
    max_GBps: float | None = None


class FsdpRow(msgspec.Struct):
    """Per FSDP rank of a run folder: shard, gathered and optimizer bytes, in words too."""

    rank: int
    fsdp_sharded: int | None = None
    fsdp_gathered: int | None = None
    fsdp_gathered_how: str | None = None
    allocator_peak: int | None = None
    optimizer_state: int | None = None
    fsdp_unsharded: int | None = None
    gathered_modules: str | None = None
    gathered_step: int | None = None
    text: str = ""


def missing_as_nan(rows: list[Any]) -> Any:
    """``rows_json``'s rows as a DataFrame, each missing figure NaN (never None
    beside NaN in one table); a column of missing figures only is float."""
    import numpy as np
    import pandas as pd

    return pd.DataFrame(rows).replace({None: np.nan}).infer_objects()


def rows_json(rows: Sequence[msgspec.Struct]) -> list[Any]:
    """A table as ``--json`` prints it and a DataFrame takes it: one dict per
    row, ``UNSET`` fields left out."""
    return msgspec.to_builtins(rows)  # type: ignore[no-any-return]
