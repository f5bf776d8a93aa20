"""What one trace of a multi-rank run is summarised to (``TraceFigures``):
the figures a worker computes from a rank's trace (``analysis.runs.
rank_figures`` and ``frontends.runs.api``), the run's tables are made of, and
a saved ``run`` Profile keeps (``RunPayload.figures``, JSON).

Each struct names its fields with their types. ``None`` is a figure that the
trace cannot give (no GPU work in the window: HTA would fail), never 0.
Encoded with ``msgspec.to_builtins`` the JSON keeps the shape the plain
dicts had; a saved file is decoded once (``msgspec.convert``), where missing
keys take their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType


@dataclass
class Problem:
    """One thing wrong with a run's input, named with the file (or folder) it is
    about (``formats.run_folder.sources.discover``, a worker, a damaged file)."""

    kind: str  # "not a trace" | "truncated" | "duplicate rank" | "world size" |
    #            "missing rank" | "no rank" | "unreadable" | "no traces" | "missing"
    path: str
    message: str


#: a GPU stream's device or stream as the trace names it (a number, or a label)
Lane = int | str | None


class GpuWindow(msgspec.Struct):
    """How the GPU work's window was chosen (``analysis.trace.gpu.gpu_work``):
    ``steps`` (ProfilerStep spans), whether it ``applied``, the GPU events and
    how many were ``dropped`` outside it."""

    steps: int = 0
    applied: bool = False
    gpu_events: int = 0
    dropped: int = 0


class Temporal(msgspec.Struct):
    """HTA's temporal breakdown of one trace's GPU timeline (µs and % of the span)."""

    gpu: bool = False
    window: GpuWindow | None = None
    span_us: float | None = None
    busy_us: float | None = None
    idle_us: float | None = None
    compute_us: float | None = None
    non_compute_us: float | None = None
    idle_pct: float | None = None
    compute_pct: float | None = None
    non_compute_pct: float | None = None


class IdleStream(msgspec.Struct):
    """One GPU stream's idle time: host wait, kernel wait and other (µs, %)."""

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


class Overlap(msgspec.Struct):
    """Communication µs and the part compute overlapped (HTA's overlap)."""

    gpu: bool = False
    communication_us: float | None = None
    overlapped_us: float | None = None
    overlap_pct: float | None = None


class KindTime(msgspec.Struct):
    """One kind of GPU work: summed µs, events and distinct names."""

    us: float = 0.0
    count: int = 0
    names: int = 0


class KernelStat(msgspec.Struct):
    """One kernel name: calls and µs (total, mean, min, max, sample std)."""

    name: str
    count: int
    total_us: float
    mean_us: float
    min_us: float
    max_us: float
    std_us: float


class KernelRest(msgspec.Struct):
    """The names outside a kind's top: how many, their calls and µs."""

    names: int
    count: int
    total_us: float


class TopKernels(msgspec.Struct):
    """A kind's top kernels by total time, and the rest summed."""

    kernels: list[KernelStat] = msgspec.field(default_factory=list)
    rest: KernelRest | None = None


class KernelState(msgspec.Struct):
    """One of HTA's overlap states (``compute overlapping communication``...)."""

    state: str
    us: float
    pct: float | None


class Kernels(msgspec.Struct):
    """Time by kind of GPU work, HTA's overlap states and each kind's top kernels."""

    gpu: bool = False
    kinds: dict[str, KindTime] | None = None
    states: list[KernelState] | None = None
    top: dict[str, TopKernels] | None = None


class CollectiveTime(msgspec.Struct):
    """One collective's communication µs, the part under compute, the rest."""

    communication_us: float
    overlapped_us: float
    exposed_us: float
    overlap_pct: float | None


class CollectiveOverlap(msgspec.Struct):
    """Per collective the rank ran (``all_gather``, ``all_reduce``...): its overlap."""

    gpu: bool = False
    collectives: dict[str, CollectiveTime] | None = None


class Summary(msgspec.Struct):
    """A series' count, mean, sample std, min, quartiles and max (HTA's describe)."""

    #: None: a memory kind whose bandwidth series has no point
    count: int | None = None
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    p25: float | None = None
    p50: float | None = None
    p75: float | None = None
    max: float | None = None


class Cutoffs(msgspec.Struct):
    """The launch statistics' cutoffs (µs): a long launch call, a long delay."""

    runtime_us: float
    launch_delay_us: float


class LaunchOutlier(msgspec.Struct):
    """One launch with a long launch delay."""

    name: str
    api: str
    ts_us: float
    cpu_us: float
    gpu_us: float
    delay_us: float


class NameLaunches(msgspec.Struct):
    """One GPU name's launches: count, delay, launch call and GPU time."""

    name: str
    count: int
    delay_total_us: float
    delay_mean_us: float
    delay_max_us: float
    cpu_mean_us: float
    gpu_mean_us: float
    gpu_shorter_than_cpu: int


class LaunchStats(msgspec.Struct):
    """One trace's CUDA kernel launch statistics (``analysis.runs.launches``);
    ``None`` figures without GPU work."""

    gpu: bool = False
    cutoffs: Cutoffs | None = None
    launches: int | None = None
    apis: dict[str, int] | None = None
    cpu_us: Summary | None = None
    gpu_us: Summary | None = None
    delay_us: Summary | None = None
    gpu_shorter_than_cpu: int | None = None
    gpu_shorter_than_cpu_pct: float | None = None
    short_kernels: int | None = None
    runtime_outliers: int | None = None
    delay_outliers: int | None = None
    outliers: list[LaunchOutlier] | None = None
    by_name: list[NameLaunches] | None = None


class QueueLength(Summary):
    """One GPU stream's launches, queue length summary and time at the full queue."""

    device: Lane = None
    stream: Lane = None
    launches: int = 0
    full_us: float = 0.0
    full_pct: float | None = None


class MemoryBandwidth(Summary):
    """One memory kind's events, bytes and GB/s summary."""

    kind: str = ""
    events: int = 0
    bytes: int = 0


class CollectiveTable(msgspec.Struct):
    """A trace's collectives as columns, in issue order
    (``analysis.runs.collectives.collective_table``): ``name`` codes into ``names``."""

    names: list[str] = msgspec.field(default_factory=list)
    name: list[int] = msgspec.field(default_factory=list)
    t0: list[float] = msgspec.field(default_factory=list)
    dur_us: list[float] = msgspec.field(default_factory=list)
    bytes: list[int | None] = msgspec.field(default_factory=list)
    kernel_us: list[float | None] = msgspec.field(default_factory=list)
    kernel_start_us: list[float | None] = msgspec.field(default_factory=list)
    group: list[int | None] = msgspec.field(default_factory=list)
    pg: list[str | None] = msgspec.field(default_factory=list)


class Collective(msgspec.Struct):
    """One collective of one rank (``collectives.records``): its place, kind,
    issue and end (unix s), duration, bytes and first NCCL kernel's start ``k0``."""

    seq: int
    name: str
    t0: float
    t1: float
    dur_us: float
    k0: float | None = None
    bytes: int | None = None
    kernel_us: float | None = None
    group: int | None = None
    pg: str | None = None


class Busy(msgspec.Struct):
    """The timeline's merged short events: lane, time bin, busy share."""

    lane: list[int] = msgspec.field(default_factory=list)
    bin: list[int] = msgspec.field(default_factory=list)
    share: list[float] = msgspec.field(default_factory=list)


class LaneSummary(msgspec.Struct):
    """One trace's lanes and bounded events for the run timeline (``analysis.runs.lanes``)."""

    origin_s: float = 0.0
    span_us: list[float] = msgspec.field(default_factory=lambda: [0.0, 0.0])
    lanes: list[str] = msgspec.field(default_factory=list)
    names: list[str] = msgspec.field(default_factory=list)
    lane: list[int] = msgspec.field(default_factory=list)
    t: list[float] = msgspec.field(default_factory=list)
    d: list[float] = msgspec.field(default_factory=list)
    kind: list[int] = msgspec.field(default_factory=list)
    name: list[int] = msgspec.field(default_factory=list)
    seq: list[int] = msgspec.field(default_factory=list)
    events: int = 0
    bin_us: float = 1.0
    busy: Busy = msgspec.field(default_factory=Busy)


class NameTotals(msgspec.Struct):
    """One kind's top names (count and µs each) and the rest summed."""

    names: list[str] = msgspec.field(default_factory=list)
    count: list[int] = msgspec.field(default_factory=list)
    us: list[float] = msgspec.field(default_factory=list)
    rest: OtherNames | None = None


class OtherNames(msgspec.Struct):
    """The names outside a kind's top: how many, their calls and µs."""

    names: int
    count: int
    us: float


class OpTotals(msgspec.Struct):
    """Per kind of event, the per-name totals ``run.diff()`` compares, and how
    many ``ProfilerStep#N`` spans they cover (0: the whole trace)."""

    steps: int = 0
    kinds: dict[str, NameTotals] = msgspec.field(default_factory=dict)


class TraceFigures(msgspec.Struct):
    """Everything the run keeps of one trace of one rank (module docstring).

    ``steps``: the ``%%torchprof`` step breakdown, one dict of µs per role per
    step (``analysis.trace.steps.step_records``); ``collectives``: the trace's
    collectives (columns, or records where a caller gives them so);
    ``host``: the trace's host name; ``trace``: the file's place among its
    rank's inputs; ``lanes``, ``op_totals`` and ``ops`` (the op table's sums,
    ``analysis.trace.ops.OpSums`` as JSON) are left out by ``tables_only``.
    These are ``UNSET`` (no JSON key) until the run's reader sets them:
    ``rank_figures`` alone gives the eight HTA figures."""

    temporal: Temporal = msgspec.field(default_factory=Temporal)
    idle: list[IdleStream] = msgspec.field(default_factory=list)
    overlap: Overlap = msgspec.field(default_factory=Overlap)
    kernels: Kernels = msgspec.field(default_factory=Kernels)
    collective_overlap: CollectiveOverlap | None = None
    launches: LaunchStats | None = None
    queues: list[QueueLength] = msgspec.field(default_factory=list)
    memory_bw: list[MemoryBandwidth] = msgspec.field(default_factory=list)
    steps: list[dict[str, int | float]] | UnsetType = UNSET
    collectives: CollectiveTable | list[Collective] | UnsetType = UNSET
    host: str | None | UnsetType = UNSET
    trace: int | UnsetType = UNSET
    lanes: LaneSummary | UnsetType = UNSET
    op_totals: OpTotals | UnsetType = UNSET
    ops: dict[str, Any] | UnsetType = UNSET

    def place(self, default: int) -> int:
        """``trace``, the file's place among its rank's inputs; ``default`` when not set."""
        return default if isinstance(self.trace, UnsetType) else self.trace

    def step_list(self) -> list[dict[str, int | float]]:
        """``steps``, empty where the worker set none."""
        return [] if isinstance(self.steps, UnsetType) else self.steps


class FsdpFigures(msgspec.Struct, omit_defaults=True):
    """One FSDP rank of a ``torchlens run`` folder, from its step records
    (``analysis.runs.fsdp.FsdpSteps``): the gathered peak (bytes, modules,
    step), the last shard and optimizer-state figures said, why a count
    failed, and whether the rank ran on CUDA. A figure never said is left
    out of the JSON."""

    gathered_peak_bytes: int | None = None
    gathered_peak_modules: list[str] | None = None
    gathered_peak_step: int | None = None
    sharded_bytes: int | None = None
    unsharded_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    optimizers: list[str] | None = None
    gathered_error: str | None = None
    optimizer_state_error: str | None = None
    cuda: bool = False


#: rank -> its traces' figures, in input order
RankFigures = dict[int, list[TraceFigures]]
