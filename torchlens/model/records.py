"""What a profiled rank sends: one ``StepRecord`` per step, one ``StepSummary``
per profiled step (the contract, with every field's meaning, is
docs/RANK_PROFILE.md).

Why ``msgspec.Struct`` and not a dataclass: records arrive as JSON at up to
a thousand ranks times the step rate, and msgspec decodes a batch's bytes
straight into typed records (checked on the way) faster than ``json.loads``
builds dicts; ``UNSET`` leaves ``restart`` out of the JSON of a first start,
as the files and messages of earlier versions have it, so a record's JSON
keeps its exact keys on disk and on the wire; and a frozen struct without GC
tracking (its fields hold no references back) is smaller and cheaper to
make than a dataclass, which counts when the collector keeps 64 of them per
rank. A field an older writer did not send takes its default; a key this
version does not know is ignored.

The summary is a bounded JSON document (``analysis.ranks.summary``) that
travels and is stored as received (the collector keeps only its head);
readers decode it once into a ``StepSummary``, whose fields are its keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from torchlens.model.compiled import CompileLog


class StepMemory(msgspec.Struct, frozen=True, gc=False):
    """A step's memory at its end: the CUDA allocator's counters (``source``
    ``cuda``) or the resident set alone (``rss``); None is not measured.
    ``heap``: the C heap's bytes in use (glibc's ``mallinfo2``), which falls
    when memory is freed, as RSS seldom does; unset (left out of the JSON, so
    older records keep their exact bytes) where the C library does not say."""

    rss: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    inactive_split: int | None = None
    largest_free: int | None = None
    source: str | None = None
    heap: int | UnsetType = UNSET

    def replace(self, **changes: Any) -> StepMemory:
        return msgspec.structs.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not UNSET}


class GpuStepTimes(msgspec.Struct, frozen=True, gc=False):
    """An earlier step of the same rank timed on its GPU: seconds between CUDA
    events recorded on the device's current stream at each phase boundary
    (``phases``, as ``StepRecord.phases``) and at the step's two ends
    (``step_s``). The GPU's own time in a phase includes a wait for NCCL where
    the stream waits for it, which the host timers miss."""

    step: int
    step_s: float
    phases: dict[str, float | None] = {}


class DdpStep(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """How a DDP rank's step synchronised its gradients (``capture.ranks.phases``):
    ``syncs``, the forwards of one DDP module in the step that will all-reduce
    their gradients (not under ``no_sync()``; the most of any module, so two
    models stepped together count once each); and, once DDP has built its
    buckets, its bucket cap, how many buckets and their bytes together (in
    every record, so a window of the newest steps has them); every few steps
    the parameters' sum, and in the step after it whether they moved before
    its first forward. Unset fields are left out of the JSON."""

    syncs: int = 0
    bucket_cap_bytes: int | None = None
    buckets: int | None = None
    bucket_bytes: int | None = None
    #: every ``PARAM_EVERY`` steps: the sum of the DDP module's parameters at
    #: the step's end (float64), to compare across ranks at the same step
    param_sum: float | None = None
    #: in the step after one with ``param_sum``: whether the parameters had
    #: changed by its first forward (changed outside the optimizer step)
    params_moved: bool | None = None


class HostStep(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """Where a step's host time went besides its phases (``capture.ranks.host_time``,
    seconds): ``gc_s`` in Python's garbage collections (every thread's);
    ``runq_s`` the training thread waited, runnable, for a CPU (Linux's
    ``/proc/thread-self/schedstat``: another process or thread on its core);
    ``cpu_s`` it ran on a CPU (the same file). None: not measured."""

    gc_s: float | None = None
    runq_s: float | None = None
    cpu_s: float | None = None


class ScalerStep(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """Mixed precision's loss scaler in a step (``capture.trace.scaler``):
    ``steps`` optimizer steps ``GradScaler.step`` was asked for, ``skipped`` of
    them not taken for inf/nan gradients, ``scale`` the loss scale the last of
    them used; ``total_*`` the same since the rank began, ``first_scale`` the
    scale of its first step."""

    steps: int = 0
    skipped: int = 0
    scale: float | None = None
    total_steps: int = 0
    total_skipped: int = 0
    first_scale: float | None = None
    #: the scale after the last step's ``update()``: the one the scaler holds now
    #: (halved after a skip, grown after ``growth_interval`` good steps)
    next_scale: float | None = None


class FsdpStep(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """What a ``torchlens run`` step of an FSDP rank held beyond its activations
    (``capture.ranks.fsdp_memory``, bytes): the rank's parameter shards and the
    same parameters gathered (``sharded_bytes``, ``unsharded_bytes``); the most
    gathered parameters alive at once in the step and the FSDP modules they
    were (``gathered_peak_*``); the optimizer state (the local shard of each
    state tensor) and which optimizers held it. ``*_error``: why a figure was
    not measured (FSDP's internals not as expected). Unset fields are left out
    of the JSON."""

    sharded_bytes: int | None = None
    unsharded_bytes: int | None = None
    gathered_peak_bytes: int | None = None
    gathered_peak_modules: list[str] = []
    gathered_error: str | None = None
    optimizer_state_bytes: int | None = None
    optimizers: list[str] = []
    optimizer_state_error: str | None = None
    #: ``%ddp_check``'s step only: the CUDA allocator's peak over the step
    allocator_peak_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v not in (None, [])}


class StepRecord(msgspec.Struct, frozen=True, gc=False):
    """One ``torchlens.step()`` call (or fixed window) of one rank.

    Times are unix seconds, ``phases`` seconds by phase (None: its timer
    never ran), ``tl_s`` torchlens' own time inside the call. ``restart``:
    which start of the rank the step belongs to, set by the collector's feed
    and run folder for a restarted rank (``start`` reads it as 0 when unset).
    ``gpu``: on a rank whose job uses CUDA, the GPU times of the earlier steps
    (of the same start) whose CUDA events had completed when this step ended
    (they are read without waiting for the GPU, so a step's come with a later
    record); unset elsewhere. ``fsdp``: an FSDP rank's parameter and optimizer
    memory in the step (``FsdpStep``); unset on a rank without FSDP. ``ddp``:
    how a DDP rank's step synchronised its gradients (``DdpStep``); unset on a
    rank that ran no DDP forward in the step. ``host``: garbage collection and
    run-queue time of the step (``HostStep``); unset where not measured.
    ``compiled``: what ``torch.compile`` compiled in the step, with the guard
    of each recompile and the reason of each graph break (``CompileLog``);
    unset on a step that compiled nothing. ``compiled_so_far``: everything
    the rank compiled since it began, sent once in 50 steps (so each window a
    rule judges holds the graph breaks met at the first steps); unset on the
    others. ``scaler``: ``torch.amp.GradScaler``'s steps and skips in the step
    (``ScalerStep``); unset where no scaler stepped.
    """

    step: int
    t0: float
    t1: float
    phases: dict[str, float | None] = {}
    profiled: bool = False
    window: bool = False
    mem: StepMemory | None = None
    tl_s: float | None = None
    restart: int | UnsetType = UNSET
    gpu: list[GpuStepTimes] | UnsetType = UNSET
    label: str | UnsetType = UNSET
    fsdp: FsdpStep | UnsetType = UNSET
    ddp: DdpStep | UnsetType = UNSET
    host: HostStep | UnsetType = UNSET
    compiled: CompileLog | UnsetType = UNSET
    compiled_so_far: CompileLog | UnsetType = UNSET
    scaler: ScalerStep | UnsetType = UNSET

    @property
    def labelled(self) -> bool:
        """Whether the span is not a training step (``label`` set)."""
        return isinstance(self.label, str)

    @property
    def start(self) -> int:
        """Which start of its rank this step is of: 0 the first, k after the k-th restart."""
        restart = self.restart
        return restart if isinstance(restart, int) and restart > 0 else 0

    def replace(self, **changes: Any) -> StepRecord:
        return msgspec.structs.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON builtins, keys in the documented order."""
        return msgspec.to_builtins(self)

    def to_json(self) -> str:
        """The record as one line of ``steps.jsonl`` writes it."""
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: Any) -> StepRecord:
        """A record from decoded JSON; ``msgspec.ValidationError`` when it is not one."""
        return msgspec.convert(data, cls)

    @classmethod
    def from_json(cls, line: str | bytes) -> StepRecord:
        """A record from its JSON text (a ``steps.jsonl`` line)."""
        try:
            return _ONE.decode(line)
        except msgspec.DecodeError:  # NaN or Infinity, which msgspec's JSON refuses
            return cls.from_dict(json.loads(line))


_ONE = msgspec.json.Decoder(StepRecord)
_BATCH = msgspec.json.Decoder(list[StepRecord])


def without_setup(records: Iterable[StepRecord]) -> Iterator[StepRecord]:
    """A rank's records without its set-up: the one rule every reader follows.

    The stepper cuts fixed windows (``window``) until the rank's first
    ``torchlens.step()``, then counts from step 0 again; those windows were
    its set-up (loading, DDP's construction), not steps, and a set-up of
    seconds drawn or judged as step 0 hides every real step. So windows
    before a real step go (a restarted rank's set-up windows too: they come
    before its first real step), and a rank that never stepped keeps them (a
    function without ``torchlens.step()`` is measured in windows). Streams:
    a run folder's records are read one at a time."""
    held: list[StepRecord] = []
    stepped = False
    for rec in records:
        if rec.window:
            held.append(rec)
            continue
        held.clear()
        stepped = True
        yield rec
    if not stepped:
        yield from held


def records_from(values: Iterable[Any]) -> tuple[list[StepRecord], int]:
    """The step records among decoded JSON ``values``, and how many were not one."""
    out, bad = [], 0
    for value in values:
        try:
            out.append(msgspec.convert(value, StepRecord))
        except msgspec.ValidationError:
            bad += 1
    return out, bad


def decode_batch(body: bytes) -> tuple[list[StepRecord], int]:
    """A rank's batch of step records (a JSON list) and how many items were not
    records; ``ValueError`` when ``body`` is not a JSON list."""
    try:
        return _BATCH.decode(body), 0
    except msgspec.DecodeError:  # an odd item, or NaN: item by item
        data = json.loads(body)
    if not isinstance(data, list):
        raise ValueError("not a list of step records")
    return records_from(data)


class SummaryMemory(msgspec.Struct, frozen=True, gc=False):
    """A profiled step's memory (``analysis.ranks.step_memory``): the CUDA
    allocator's counters (``source`` ``cuda``) or, on a CPU run, the step's
    allocations replayed through the caching-allocator model (``modelled``)."""

    allocated: int | None = None
    reserved: int | None = None
    inactive_split: int | None = None
    largest_free: int | None = None
    peak_allocated: int | None = None
    source: str | None = None


class SummaryOp(msgspec.Struct, frozen=True, gc=False):
    """One of a profiled step's longest events: unix start ``t0`` and ``dur``
    (seconds), its ``lane`` (an index into ``StepSummary.lanes``), nesting
    ``depth`` on its thread and ``kind`` (``op``, ``kernel``, ``memcpy``, ...)."""

    name: str
    t0: float
    dur: float
    lane: int = 0
    depth: int = 0
    kind: str = "op"


class SummaryCollective(msgspec.Struct, frozen=True, gc=False):
    """One collective of a profiled step, in host order: ``seq`` matches across
    ranks; ``t0`` when the host issued it, ``k0`` (unset without a NCCL kernel
    in the trace) when its first kernel started; ``bytes`` None when not looked up."""

    name: str
    t0: float
    dur: float
    lane: int = 0
    seq: int = 0
    bytes: int | None = None
    k0: float | UnsetType = UNSET


class TopOp(msgspec.Struct, frozen=True, gc=False):
    """An op name of a profiled step with the most self time."""

    name: str
    calls: int = 0
    self_ms: float | None = None
    total_ms: float | None = None


class CollectiveOverlap(msgspec.Struct, frozen=True, gc=False):
    """One collective's communication in a profiled step, and the part of it
    that ran under compute (µs; None: not finite in the trace)."""

    communication_us: float | None = None
    overlapped_us: float | None = None


class StepOverlap(msgspec.Struct, frozen=True, gc=False):
    """A profiled step's communication overlapped by compute, per collective
    name; ``collectives`` None when the step ran no GPU work (``gpu`` false)."""

    gpu: bool = False
    collectives: dict[str, CollectiveOverlap] | None = None


class StepSummary(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """One profiled step, summarised by its rank (at most 64 KB as JSON).

    ``breakdown``: the ``%%torchprof`` step breakdown in µs (``kernel_us``,
    ``memcpy_us``, ..., ``other_us``). The collector keeps the head
    (``protocol.SUMMARY_KEYS``); ``kinds``, ``dropped``, ``lanes``, ``ops``,
    ``collectives`` and ``top_ops`` come only with a full summary (the
    kernel's, or a finished run folder's) and are unset otherwise. ``restart``
    is set by the collector's feed for a restarted rank, as on ``StepRecord``.
    Fields in the order the rank writes them; unset ones are left out of the
    JSON. ``step`` and ``t0`` are required: without them a summary cannot be placed.
    """

    rank: int = 0
    step: int
    trace: str = ""
    t0: float
    t1: float = 0.0
    step_ms: float | None = None
    breakdown: dict[str, float] = {}
    events: int = 0
    kinds: dict[str, int] | UnsetType = UNSET
    overlap: StepOverlap | UnsetType = UNSET
    dropped: int | UnsetType = UNSET
    lanes: list[str] | UnsetType = UNSET
    ops: list[SummaryOp] | UnsetType = UNSET
    collectives: list[SummaryCollective] | UnsetType = UNSET
    top_ops: list[TopOp] | UnsetType = UNSET
    memory: SummaryMemory | None = None
    bytes: int | UnsetType = UNSET
    restart: int | UnsetType = UNSET

    @property
    def start(self) -> int:
        """Which start of its rank the step is of (as ``StepRecord.start``)."""
        restart = self.restart
        return restart if isinstance(restart, int) and restart > 0 else 0

    def replace(self, **changes: Any) -> StepSummary:
        return msgspec.structs.replace(self, **changes)

    @classmethod
    def of(cls, value: StepSummary | Any) -> StepSummary:
        """A summary from a struct or its decoded JSON; ``msgspec.ValidationError``
        when it is not one."""
        return value if isinstance(value, cls) else msgspec.convert(value, cls)


def summaries_from(values: Iterable[Any]) -> tuple[list[StepSummary], int]:
    """The profiled-step summaries among decoded JSON ``values`` (or structs),
    and how many were not one."""
    out, bad = [], 0
    for value in values:
        try:
            out.append(StepSummary.of(value))
        except msgspec.ValidationError:
            bad += 1
    return out, bad
