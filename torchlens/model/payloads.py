"""One typed payload per kind of Profile: what a capture knew that the traces,
tables and snapshots do not say.

Why typed: in untyped dicts (say ``options`` and ``extra``) read through
``.get()`` chains, capture names (``record_shapes``) and display names
(``shapes``) mix and render has to reconcile them. A payload names
every field once, with its type and default, and is the only place a reader
looks. Capture builds it; the ``.tlprof`` file stores it as JSON under
``payload`` (format version 2); ``upgrade_v1`` turns a version-1 file's
``options``/``extra`` into the same objects.

Adding a kind: a dataclass here, an entry in ``PAYLOADS``, and a line in
``frontends.kinds``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import msgspec

from torchlens.model.collectives import Fingerprint, fingerprints_from
from torchlens.model.compiled import CompileLog
from torchlens.model.errors import InputError
from torchlens.model.findings import INFO, NOTE, RUN_DIFF, Finding, as_finding
from torchlens.model.memory_figures import (
    MemoryDiff,
    MemoryRanks,
    memory_diff_from,
    memory_ranks_from,
)
from torchlens.model.messages import BeatRow, MemoryReading
from torchlens.model.rank_report import RankReport, report_from
from torchlens.model.records import ScalerStep, StepRecord, StepSummary, records_from
from torchlens.model.run_figures import FsdpFigures, Problem, TraceFigures


@dataclass
class OpDisplay:
    """What the op table shows: rows, order and the optional columns.

    ``sort`` is an op-table column (``analysis.trace.ops.SORT_KEYS`` maps the
    user's keys to columns). A column the user asked the profiler to record is
    a column they want to see, so capture sets ``shapes``/``stack``/``flops``
    from the recording options.
    """

    top: int = 20
    sort: str = "total_cpu_us"
    shapes: bool = False
    stack: bool = False
    flops: bool = False


@dataclass(frozen=True)
class ProfilerOptions:
    """What ``torch.profiler`` is asked to record. ``cuda=None`` records CUDA
    activity when a GPU exists. Checked on creation: a bad schedule is an
    InputError before anything runs."""

    record_shapes: bool = False
    with_stack: bool = False
    profile_memory: bool = False
    with_flops: bool = False
    schedule: tuple[int, int, int] | None = None
    cuda: bool | None = None

    def __post_init__(self) -> None:
        schedule = self.schedule
        if schedule is not None and (
            len(schedule) != 3
            or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in schedule)
            or schedule[2] < 1
        ):
            raise InputError(
                "schedule must be WAIT,WARMUP,ACTIVE: three whole numbers >= 0 with "
                f"ACTIVE >= 1, e.g. 1,1,3; got {','.join(map(str, schedule))}"
            )


@dataclass
class TracePayload:
    """``kind="trace"``: a Kineto trace file read as it is."""

    display: OpDisplay = field(default_factory=OpDisplay)


@dataclass
class TorchprofPayload:
    """``kind="torchprof"``: what ``torch.profiler`` was asked to record, and how
    long the capture's own parts took (``timings``, seconds by part)."""

    display: OpDisplay = field(default_factory=OpDisplay)
    recorded: ProfilerOptions = field(default_factory=ProfilerOptions)
    timings: dict[str, float] = field(default_factory=dict)
    profiler_overhead_s: float | None = None
    steps_marked: int = 0
    #: what ``torch.compile`` compiled while the cell ran (None: nothing)
    compiled: CompileLog | None = None
    #: ``torch.amp.GradScaler``'s optimizer steps and skips in the cell (None: none)
    scaler: ScalerStep | None = None
    #: the notebook's cell file names -> In[N], to name a compiled line ``cell [N] line L``
    cells: dict[str, int] = field(default_factory=dict)


#: where a live capture's categories come from: torchlens' stack rules or torch's
#: memory profiler (``torch.profiler._memory_profiler``)
CATEGORY_SOURCES = ("inferred", "torch")


@dataclass(frozen=True)
class MemoryOptions:
    """What allocator history to record: the CUDA device, Python frames kept
    per allocation, the history's size. Checked on creation (InputError).

    ``max_entries`` bounds the host memory the history costs: torch keeps it
    as a ring buffer of that many entries per device, and its docstring puts
    an entry at "several KB" with stacks (the Python stack of an allocation
    plus the symbolized dict ``_snapshot`` builds from it, and the trimmed copy
    the capture keeps). 100,000 entries is about 0.1 to 0.5 GB at that rate,
    where 1,000,000 could cost gigabytes; it holds about ten training
    steps of a model making 3,000 allocations a step (alloc, free_requested
    and free_completed: three entries each). A longer cell wraps the buffer:
    the analysis detects it and says how much of the cell is missing.
    """

    device: int = 0
    stacks: int = 32
    max_entries: int = 100_000
    #: "torch": also run torch's memory profiler for the categories (costs seconds)
    categories: str = "inferred"

    def __post_init__(self) -> None:
        if self.categories not in CATEGORY_SOURCES:
            raise InputError(f"categories must be one of {', '.join(CATEGORY_SOURCES)}, "
                             f"got {self.categories!r}")
        for name in ("device", "stacks"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InputError(f"{name} must be a whole number >= 0, got {v!r}")
        if not isinstance(self.max_entries, int) or self.max_entries < 1:
            raise InputError(f"max_entries must be >= 1, got {self.max_entries!r}")


@dataclass
class GpumemPayload:
    """``kind="gpumem"``: where the allocator history came from and what the
    user asked the analysis to do with it.

    ``measured_on`` is ``"cuda"`` (a CUDA snapshot), ``"cpu"`` (the CPU
    allocator's events; the allocator model supplies reserved memory) or
    ``"snapshot"`` (a file someone sent); ``recorded`` is what was asked of
    the recording (for a file: the device whose trace to read). ``stats_*`` are
    ``torch.cuda.memory_stats()`` around the cell (empty on CPU). ``runs`` are
    the (start_us, end_us) of each ``--repeat`` run.
    """

    measured_on: str = "snapshot"
    recorded: MemoryOptions = field(default_factory=MemoryOptions)
    #: ``torch.cuda.memory_stats()``: statistic name -> a count or bytes (whole numbers)
    stats_before: dict[str, int] = field(default_factory=dict)
    stats_after: dict[str, int] = field(default_factory=dict)
    start_us: int | None = None
    end_us: int | None = None
    runs: list[tuple[int, int]] = field(default_factory=list)
    capture_stop_s: float | None = None
    simulate: bool = False
    capacity: int | None = None
    alloc_conf: str = ""
    repeat: int = 1
    top: int = 15
    #: the kernel's cell file names -> In[N], to name sites ``cell [N] line L``
    cells: dict[str, int] = field(default_factory=dict)
    #: CUDA: the allocator backend (``torch.cuda.memory.get_allocator_backend()``)
    allocator_backend: str = ""
    #: False: no allocator history could be recorded (``history_error`` says why);
    #: the figures are ``stats_before``/``stats_after`` only
    history: bool = True
    history_error: str = ""
    #: history was already on when the cell started (the user's recording): it was
    #: left on, with the user's settings, and only the cell's entries were kept
    user_recording: bool = False
    #: entries the device's history held when it was read, before trimming to the
    #: cell, and whether that filled the ring buffer (None: the size is the user's)
    history_entries: int | None = None
    history_full: bool | None = None
    #: categories were asked of torch's memory profiler and it gave none: why (one line)
    categories_error: str = ""


@dataclass
class RankProfiling:
    """What ``%ddp_check --profile`` measured on each rank (docs/RANK_PROFILE.md).

    ``every``: one step in ``every`` ran under torch.profiler. ``steps`` per
    rank: every step record (phases, memory); ``summaries`` per rank: the
    profiled-step summaries the kernel kept (the newest ``keep`` of each rank;
    every raw trace stays in ``run_dir``). ``windows``: the function never
    called ``torchlens.step()`` and fixed windows of ``window_s`` were cut
    instead. ``max_steps``: the run stopped each rank after that many steps.
    ``steps_by``: how the steps were found (``torchlens.step()``, the
    optimizer's steps, fixed windows; ``capture.ranks.autostep``).
    """

    every: int = 5
    window_s: float = 1.0
    run_dir: str = ""
    max_steps: int | None = None
    keep: int = 50
    windows: bool = False
    steps_by: str = ""
    steps: list[list[StepRecord]] = field(default_factory=list)
    summaries: list[list[StepSummary]] = field(default_factory=list)
    #: per rank: summaries received but not kept in memory (older than ``keep``)
    dropped_summaries: list[int] = field(default_factory=list)


class HangInfo(msgspec.Struct):
    """Why the hang detector stopped a ``%ddp_check`` run: how long no rank made
    progress, each rank's Python stack, and its last heartbeat as the rank
    sent it (``DdpHeartbeat.row``; None: it sent none)."""

    after_s: float = 0.0
    stacks: list[str] = []
    status: list[BeatRow | None] = []


class RankNode(msgspec.Struct):
    """Where one rank of a ``%ddp_check --nnodes`` run ran (None: not known)."""

    node: int | None = None
    host: str | None = None


class NodesInfo(msgspec.Struct):
    """A ``%ddp_check --nnodes`` run's layout: its nodes, ranks per node,
    rendezvous, and per rank its node and host."""

    nnodes: int = 0
    nproc_per_node: int = 0
    rdzv_endpoint: str = ""
    ranks: list[RankNode] = []


@dataclass
class DdpRun:
    """``kind="ddp_check"``: one run of a function on spawned ranks.

    ``outcome`` is finished, mismatch, hang, crashed, interrupted or
    startup_timeout. Per rank, in rank order: ``ranks`` (the report the rank
    sent, ``model.rank_report.RankReport``; None if it sent none),
    ``fingerprints`` (its collectives in issue order: index, op, shapes,
    dtypes, line, step, t, call_s), ``exit_codes``, ``ended_at`` (when the
    launcher saw the process end, epoch seconds) and ``memory_peak``.
    ``hang`` holds the last status and Python stack per rank when a hang was
    detected. Heartbeats are the Profile's ``heartbeats`` table.
    """

    world_size: int = 0
    backend: str = ""
    steps: int = 0
    strict: bool = False
    timeout_s: float = 0.0
    seed: int = 0
    outcome: str = ""
    interrupted: bool = False
    t0: float = 0.0
    wall_s: float | None = None
    port: int | None = None
    board: str | None = None
    pids: list[int] = field(default_factory=list)
    ranks: list[RankReport | None] = field(default_factory=list)
    fingerprints: list[list[Fingerprint]] = field(default_factory=list)
    exit_codes: list[int | None] = field(default_factory=list)
    ended_at: list[float | None] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    hang: HangInfo | None = None
    memory_peak: list[MemoryReading | None] = field(default_factory=list)
    #: the kernel's cell file names -> In[N], to name cells in stacks and tracebacks
    cells: dict[str, int] = field(default_factory=dict)
    #: ``--profile`` runs only: per-rank steps, memory and profiled-step summaries
    profiling: RankProfiling | None = None
    #: messages that failed their signature and were dropped, per key kind
    #: (heartbeat, result, step batch, ...): someone else wrote to the run's store
    dropped: dict[str, int] = field(default_factory=dict)
    #: ``--nnodes`` runs only: nnodes, nproc_per_node, rdzv_endpoint and per rank
    #: ``{node, host}`` (ranks started by torch's elastic agent on several nodes)
    nodes: NodesInfo | None = None

    def __post_init__(self) -> None:
        # reports given as their JSON (a test, an older caller) are typed here
        self.ranks = [report_from(r) for r in self.ranks]

    def where(self, rank: int) -> str:
        """``rank 3 (node 1, host gpu7)`` on a multi-node run, else ``rank 3``."""
        per_rank = self.nodes.ranks if self.nodes is not None else []
        if rank < len(per_rank) and per_rank[rank].node is not None:
            host = per_rank[rank].host
            return f"rank {rank} (node {per_rank[rank].node}" + (f", host {host})" if host else ")")
        return f"rank {rank}"


class StepColumns(msgspec.Struct):
    """Steps of one rank as chart columns: each step's end (s since the series'
    zero), its time in ms, its number and the start of the rank it is of
    (0: before the first restart)."""

    t: list[float] = []
    ms: list[float] = []
    step: list[int] = []
    restart: list[int] = []


class SpanColumns(StepColumns):
    """A rank's labelled spans (an evaluation, a checkpoint): ``StepColumns``
    and each span's label."""

    label: list[str] = []


class MarkColumns(StepColumns):
    """A rank's steps marked for what happened in them (``StepColumns``) and
    each one's mark (``analysis.ranks.series.MARKS``: an optimizer step the loss
    scaler skipped, a recompile)."""

    mark: list[str] = []


class RankSeries(StepColumns):
    """A rank's training steps as drawn (``StepColumns``), its labelled spans
    and its marked steps (each also a training step, drawn or not)."""

    labelled: SpanColumns = msgspec.field(default_factory=SpanColumns)
    marked: MarkColumns = msgspec.field(default_factory=MarkColumns)


class RestartMark(msgspec.Struct):
    """A restart on the chart: its number, label and sentence, when the old
    workers stopped and when the new ones stepped again (s since the zero)."""

    number: int | None = None
    label: str = ""
    words: str = ""
    t: float | None = None
    resumed: float | None = None


class StepSeries(msgspec.Struct):
    """Every step of every rank over time (``analysis.ranks.series.step_series``):
    the time zero (unix s) and what it is, per rank (a string, JSON keys) its
    steps as drawn, the restarts, and how many step records there were, were
    drawn, and were labelled spans."""

    zero: float = 0.0
    since: str = ""
    ranks: dict[str, RankSeries] = {}
    restarts: list[RestartMark] = []
    steps: int = 0
    drawn: int = 0
    labelled: int = 0
    #: marked steps, and how many were left off the chart (beyond ``MAX_MARKS`` a rank)
    marked: int = 0
    marks_left_off: int = 0


class RankMemory(msgspec.Struct):
    """One rank's memory over its steps (``analysis.runs.memory_steps``):
    its first step and the window's last, and their bytes, the
    growth per step (least squares) over ``window`` (the steps the creep rule
    fitted), whether the rank's memory creeps, and the points drawn."""

    rank: int
    first_step: int
    last_step: int
    start_bytes: float
    end_bytes: float
    growth_per_step: float | None = None
    creeps: bool = False
    step: list[int] = []
    bytes: list[float] = []


class RunMemory(msgspec.Struct):
    """Every rank's memory over its steps, from the step records' ``mem``:
    ``source`` (``allocated``, ``heap`` or ``rss``) and its words (``label``),
    the steps the growth is fitted over (``window``: first and last step; None
    when no rank has enough steps) and the ranks."""

    source: str = ""
    label: str = ""
    window: list[int] | None = None
    ranks: list[RankMemory] = []


@dataclass
class RunPayload:
    """``kind="run"``: a run's per-rank traces analysed together (``torchlens.load(RUN_DIR)``).

    ``figures``: rank (as a string, JSON keys) -> the figures of each trace
    of that rank (``model.run_figures.TraceFigures``);
    ``problems``: every input that could not be used, ``{kind, path, message}``.
    The traces themselves stay in the run folder: a run of 128 ranks is a few
    MB of figures, not GBs of events.
    """

    root: str = ""
    world_size: int | None = None
    problems: list[Problem] = field(default_factory=list)
    figures: dict[str, list[TraceFigures]] = field(default_factory=dict)
    #: what the run folder says first (``analysis.runs.verdict.leading_findings``):
    #: what stopped the run, the slow-rank verdict worked out from the step
    #: records, the collector's notes, the files not read
    notes: list[Finding] = field(default_factory=list)
    #: ``torchlens run`` folders: every rank's steps over time and the restarts
    #: (``analysis.ranks.series.step_series``); None for other folders
    collected_steps: StepSeries | None = None
    #: ``torchlens run`` folders of an FSDP job: rank (a string) -> its FSDP
    #: memory figures (``analysis.runs.fsdp.FsdpSteps``); empty otherwise
    fsdp: dict[str, FsdpFigures] = field(default_factory=dict)
    #: ``torchlens run`` and ``%ddp_check --profile`` folders: each rank's
    #: memory over its steps (``analysis.runs.memory_steps``); None without
    #: memory in the step records
    memory: RunMemory | None = None


class DiffRow(msgspec.Struct):
    """One op or kernel name of a run diff: µs and calls per step (or trace) in
    A and B, the change and its ``status`` (added, removed, slower, faster,
    small, same)."""

    kind: str
    name: str
    status: str
    a_us: float
    b_us: float
    delta_us: float
    delta_pct: float | None
    a_calls: float
    b_calls: float


class StepTime(msgspec.Struct):
    """The median step time of A and B, over how many steps and from where
    (``source``: ``step records`` or ``profiled steps``); ``None`` without steps."""

    source: str = "profiled steps"
    a_median_us: float | None = None
    b_median_us: float | None = None
    a_steps: int = 0
    b_steps: int = 0
    delta_us: float | None = None
    regression_pct: float | None = None
    #: the run-to-run noise bound on ``delta_us`` (``analysis.runs.diff``:
    #: each run's step-to-step spread, added); None with too few steps a rank
    a_spread_us: float | None = None
    b_spread_us: float | None = None
    noise_us: float | None = None
    #: whether ``|delta_us|`` is within ``noise_us`` (None without a bound)
    within_noise: bool | None = None


class RankSteps(msgspec.Struct):
    """One rank of A against its rank in B: median step times, the change and
    its run-to-run noise bound (that rank's step-to-step spread in A and in B,
    added; None with too few steps)."""

    rank_a: int
    rank_b: int
    a_median_us: float | None
    b_median_us: float | None
    delta_us: float | None
    delta_pct: float | None
    noise_us: float | None = None
    within_noise: bool | None = None


class DiffUnits(msgspec.Struct):
    """How many steps (or traces) each run's totals are divided by."""

    a: int = 0
    b: int = 0


class DiffThresholds(msgspec.Struct):
    """Within ``same_pct`` % is the same; beyond it but within ``same_us`` µs, small."""

    same_pct: float = 5.0
    same_us: float = 10.0


class DiffHeadline(msgspec.Struct):
    """What changed from A to B, said by rank and phase (``analysis.runs.diff.
    phase_headline``): the rank whose phase grew (or shrank) most, or every rank
    when each changed alike (``rank`` None, ``ranks`` all of them), the phase,
    its median ms a step in A and B (µs here), and where the other ranks show it
    (``waiting_phase``: the phase they wait in for that rank; None when none grew)."""

    rank: int | None
    ranks: list[int]
    phase: str
    before_us: float
    after_us: float
    delta_us: float
    waiting_phase: str | None = None
    waiting_delta_us: float | None = None
    sentence: str = ""


class RunDiff(msgspec.Struct):
    """``analysis.runs.diff.diff_runs``'s result: run B against run A, and its
    verdict (a ``Finding``, code ``run_diff``)."""

    per: str = "step"
    units: DiffUnits = msgspec.field(default_factory=DiffUnits)
    thresholds: DiffThresholds = msgspec.field(default_factory=DiffThresholds)
    step_time: StepTime = msgspec.field(default_factory=StepTime)
    rank_steps: list[RankSteps] = msgspec.field(default_factory=list)
    #: status -> how many op and kernel rows have it
    summary: dict[str, int] = msgspec.field(default_factory=dict)
    ops: list[DiffRow] = msgspec.field(default_factory=list)
    kernels: list[DiffRow] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    verdict: Finding = msgspec.field(default_factory=lambda: Finding(INFO, "", code=RUN_DIFF))
    #: the rank and phase that changed, from both runs' step records (None
    #: without step records on both sides, or when no phase changed enough)
    headline: DiffHeadline | None = None


def run_diff_from(saved: object) -> RunDiff:
    """A saved diff (``to_json``'s, the file's JSON as it reads) as a
    ``RunDiff``: its verdict was the sentence alone before findings had codes."""
    data = saved if isinstance(saved, dict) else {}
    verdict = as_finding(data.get("verdict"), INFO, RUN_DIFF) or Finding(INFO, "", code=RUN_DIFF)
    return msgspec.convert({**data, "verdict": verdict.to_dict()}, RunDiff)


@dataclass
class DiffPayload:
    """``kind="diff"``: run B against run A (``torchlens diff A B``, ``run.diff(other)``).

    ``a`` and ``b`` name the inputs (their roots); ``diff`` is
    ``analysis.runs.diff.diff_runs``'s result, kept as computed: the
    per-name totals it came from stay with the runs.
    """

    a: str = ""
    b: str = ""
    diff: RunDiff = field(default_factory=RunDiff)


@dataclass
class MemoryDiffPayload:
    """``kind="memdiff"``: memory result B against A (``torchlens diff A.pickle B.pickle``,
    ``result.diff(other)``); ``diff`` is ``analysis.memory.diff.diff_memory``'s result."""

    a: str = ""
    b: str = ""
    diff: MemoryDiff | None = None


@dataclass
class MemoryRanksPayload:
    """``kind="memranks"``: a folder of per-rank snapshots as one result
    (``torchlens.load(FOLDER)``); ``analysis`` is ``analysis.memory.ranks.analyze_ranks``'s
    result, kept as computed (the snapshots stay in the folder)."""

    root: str = ""
    analysis: MemoryRanks | None = None


Payload = (TracePayload | TorchprofPayload | GpumemPayload | DdpRun | RunPayload | DiffPayload
           | MemoryDiffPayload | MemoryRanksPayload)

#: kind -> its payload type; the kinds a Profile can be.
PAYLOADS: dict[str, type] = {
    "torchprof": TorchprofPayload,
    "gpumem": GpumemPayload,
    "ddp_check": DdpRun,
    "trace": TracePayload,
    "run": RunPayload,
    "diff": DiffPayload,
    "memdiff": MemoryDiffPayload,
    "memranks": MemoryRanksPayload,
}


def to_json(payload: Any) -> dict[str, Any]:
    """The payload as JSON-able builtins (tuples become lists, step records dicts)."""
    return dataclasses.asdict(payload, dict_factory=_builtins)


def _builtins(items: list[tuple[str, Any]]) -> dict[str, Any]:
    # asdict copies what is not a dataclass as it is: a RankProfiling's steps
    # and a run diff (msgspec structs) become their JSON builtins here
    return {k: [[r.to_dict() for r in rank] for rank in v] if k == "steps" and _records(v)
            else msgspec.to_builtins(v) if isinstance(v, msgspec.Struct)
            or (k in ("figures", "fsdp") and isinstance(v, dict))
            or (k in ("fingerprints", "memory_peak", "ranks") and isinstance(v, list))
            else {} if k == "collected_steps" and v is None  # as the JSON always said it
            else v for k, v in items}


def _records(value: Any) -> bool:
    return isinstance(value, list) and any(
        isinstance(rank, list) and rank and isinstance(rank[0], StepRecord) for rank in value)


def from_json(kind: str, data: dict[str, Any] | None) -> Any:
    """The payload of ``kind`` from ``to_json``'s output; missing keys take
    their defaults and unknown keys are ignored (files from other versions)."""
    return _build(PAYLOADS[kind], data or {})


def _build(cls: type, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, kind = data[f.name], hints[f.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None
            kind = next((a for a in typing.get_args(kind) if dataclasses.is_dataclass(a)), kind)
        if dataclasses.is_dataclass(kind) and isinstance(value, dict):
            value = _build(kind, value)  # type: ignore[arg-type]
        elif f.name == "schedule" and value is not None:
            value = tuple(value)
        elif f.name == "runs":
            value = [tuple(r) for r in value]
        elif cls is MemoryDiffPayload and f.name == "diff":
            value = memory_diff_from(value) if value else None
        elif cls is MemoryRanksPayload and f.name == "analysis":
            value = memory_ranks_from(value) if value else None
        elif cls is RankProfiling and f.name == "steps":
            value = [records_from(rank)[0] for rank in value]
        elif cls is TorchprofPayload and f.name in ("compiled", "scaler"):
            value = msgspec.convert(value, hints[f.name]) if value else None
        elif cls is RunPayload and f.name == "collected_steps":
            value = msgspec.convert(value, StepSeries) if value else None
        elif cls is RunPayload and f.name == "memory":
            value = msgspec.convert(value, RunMemory) if value else None
        elif cls is DdpRun and f.name in ("memory_peak", "nodes", "hang"):
            value = msgspec.convert(value, hints[f.name]) if value is not None else None
        elif cls is DdpRun and f.name == "ranks":
            value = [report_from(r) for r in value or []]
        elif cls is DdpRun and f.name == "fingerprints":
            value = [fingerprints_from(rank) for rank in value or []]
        elif cls is RunPayload and f.name in ("figures", "problems", "fsdp"):
            value = msgspec.convert(value or ([] if f.name == "problems" else {}), hints[f.name])
        elif cls is DiffPayload and f.name == "diff":
            value = run_diff_from(value)
        elif cls is RunPayload and f.name == "notes":
            # a saved finding's dict; an older file's plain sentence
            value = [found for n in value or () if (found := as_finding(n, INFO, NOTE)) is not None]
        values[f.name] = value
    return cls(**values)


def upgrade_v1(kind: str, options: dict[str, Any], extra: dict[str, Any]) -> Any:
    """The payload of a format-version-1 file, from its ``options`` and ``extra``.

    Version 1 stored the capture's options (torch's names) and, after the
    magic ran, the display options (``top``, ``sort``, ``shapes`` ...) in one
    dict; a display option the user did not set falls back to the recording
    option of the same meaning, as version 1's renderer did.
    """
    display = OpDisplay(
        top=int(options.get("top") or 20), sort=str(options.get("sort") or "total_cpu_us"),
        shapes=bool(options.get("shapes", options.get("record_shapes"))),
        stack=bool(options.get("stack", options.get("with_stack"))),
        flops=bool(options.get("flops", options.get("with_flops"))))
    if kind == "trace":
        return TracePayload(display)
    if kind == "torchprof":
        return from_json(kind, {**extra, "display": dataclasses.asdict(display),
                                "recorded": options})
    if kind == "gpumem":
        merged = {**options, **extra}
        merged["recorded"] = {k: merged[k] for k in ("device", "stacks", "max_entries")
                              if k in merged}
        return from_json(kind, merged)
    return from_json(kind, dict(extra.get("ddp") or {}))
