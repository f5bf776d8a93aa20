"""What an attached rank tells ``torchlens run``'s collector besides its step
records, and the collector's own rows of it: typed once where they are read.

A rank (``capture.ranks.attach``) sends a ``Hello`` when it attaches, a
``Heartbeat`` twice a second, and a ``Bye`` inside its last heartbeat. The
collector (``capture.ranks.collector``) decodes each into these structs as
it opens them, and keeps per rank a ``RankInfo`` (its latest start) and per
attached process an ``Incarnation``; a ``RankSnapshot`` is what the analysis
(``analysis.ranks.verdict.run_view``) judges.

The wire format stays the JSON objects earlier versions sent: every field
has a default, so a key an older rank left out takes it, and a key this
version does not know is ignored.
"""

from __future__ import annotations

from typing import Any

import msgspec

from torchlens.model.records import StepRecord, StepSummary


class OomOutcome(msgspec.Struct, frozen=True):
    """A rank's CUDA out-of-memory: where its allocator snapshot went (``path``)
    or why none was saved (``why``)."""

    path: str | None = None
    why: str | None = None

    def words(self) -> str:
        """The one sentence every view and the manifest's ``oom`` give."""
        if self.path:
            return f"CUDA out of memory; allocator snapshot in {self.path}"
        return f"CUDA out of memory; no allocator snapshot saved: {self.why or 'no reason given'}"


class Hello(msgspec.Struct, frozen=True):
    """What a rank says once when it attaches (its latest start's)."""

    rank: int
    world_size: int | None = None
    local_rank: int | None = None
    node: int | None = None
    host: str | None = None
    pid: int | None = None
    #: torchrun's TORCHELASTIC_RESTART_COUNT of its agent
    restart: int | None = None
    elastic_run_id: str | None = None
    slot: int | None = None
    t: float | None = None
    device: str | None = None
    run_dir: str | None = None
    #: whether its run folder is the collector's (False: it wrote to a folder of its own)
    shared_run_dir: bool | None = None


class Bye(msgspec.Struct, frozen=True):
    """Why a rank ended: ``reason`` ``exit``, ``exception``, ``SIGTERM`` or
    ``agent died``; ``error`` and ``error_t`` its uncaught exception and when it
    was raised; ``steps`` the steps it began; ``errors`` what went wrong on the
    way; ``oom`` its CUDA out-of-memory when it had one."""

    t: float | None = None
    reason: str | None = None
    error: str | None = None
    error_t: float | None = None
    steps: int | None = None
    errors: list[str] = []
    oom: OomOutcome | None = None


class RankProgress(msgspec.Struct, frozen=True):
    """Where a rank's stepper is: ``steps_done`` the index of the step now
    running, ``phase_calls`` phase timers entered, ``steps_by`` how its steps
    were found ("optimizer.step() of Adam"), ``device`` the device it steps on."""

    steps_done: int | None = None
    phase_calls: int | None = None
    steps_by: str | None = None
    device: str | None = None


class Heartbeat(msgspec.Struct, frozen=True):
    """A rank's newest heartbeat: ``sent`` counts the step batches and summaries
    it has set (which ring keys hold new values); ``steps_done`` the index of the
    step now running; ``bye`` rides on its last one."""

    t: float | None = None
    beat: float | None = None  # a counter: only whether it changed is read
    rss: int | None = None
    sent: list[int] | None = None
    steps_done: int | None = None
    phase_calls: int | None = None
    #: how its steps were found ("optimizer.step() of Adam")
    steps_by: str | None = None
    device: str | None = None
    bye: Bye | None = None
    #: step records the rank holds because its ring was full of unread values,
    #: and those it shed past its hold (``capture.ranks.attach.StepRing``)
    held: int | None = None
    shed: int | None = None
    #: profiled-step summaries not sent: their ring was full of unread ones
    skipped: int | None = None
    #: on the goodbye: step batches left in the slot's ``last`` keys at exit
    last: int | None = None


class MemoryReading(msgspec.Struct, omit_defaults=True):
    """One reading of a %ddp_check rank's memory (``capture.ddp.memory.sample``),
    or its peaks so far: bytes, None where not read."""

    rss: int | None = None
    tensor_bytes: int | None = None
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None

    def raise_to(self, other: MemoryReading) -> None:
        """Raise each figure to ``other``'s where that one is higher (a peak)."""
        for key in self.__struct_fields__:
            v, now = getattr(other, key), getattr(self, key)
            if v is not None and (now is None or v > now):
                setattr(self, key, v)


class RankPlace(msgspec.Struct, frozen=True):
    """Where a %ddp_check --nnodes rank runs: its node, host and pid (all None
    on one machine: its heartbeats do not say them)."""

    node: int | None = None
    host: str | None = None
    pid: int | None = None


class LastCollective(msgspec.Struct, frozen=True, omit_defaults=True):
    """The collective a %ddp_check rank is in or issued last (its fingerprint's
    index, op, source line and, under FSDP, the module whose parameters it moves)."""

    index: int | None = None
    op: str | None = None
    line: str | None = None
    module: str | None = None


#: a ``LastCollective`` as its JSON object
LastRow = dict[str, int | str | None]
#: a ``DdpHeartbeat`` as its JSON object (``DdpHeartbeat.row``)
BeatRow = dict[str, int | float | str | bool | LastRow | None]


class RecorderStatus(msgspec.Struct, frozen=True):
    """What a --strict rank's collective recorder puts in its heartbeat."""

    ops: int = 0
    collectives: int = 0
    step: int | None = None
    in_collective: bool = False
    last: LastCollective | None = None


#: heartbeat fields only some ranks send (recorder, stepper, --nnodes):
#: left out of a heartbeat's row when the rank did not send them
_OPTIONAL_BEAT_FIELDS = frozenset({
    "ops", "collectives", "step", "in_collective", "last", "steps_done", "phase_calls",
    "steps_by", "device", "node", "host", "pid"})


class DdpHeartbeat(msgspec.Struct, kw_only=True):
    """A %ddp_check rank's heartbeat, twice a second: its phase and memory,
    its recorder's counts (--strict), its stepper's progress (--profile) and
    where it runs (--nnodes). ``rank`` and ``t_rel`` (seconds since launch)
    are the launcher's, set as it reads the beat."""

    t: float | None = None
    beat: int | None = None
    phase: str | None = None
    #: modules imported: a rank deep in a lazy import is busy, not hung
    modules: int | None = None
    ops: int | None = None
    collectives: int | None = None
    step: int | None = None
    in_collective: bool | None = None
    last: LastCollective | None = None
    steps_done: int | None = None
    phase_calls: int | None = None
    steps_by: str | None = None
    device: str | None = None
    rss: int | None = None
    tensor_bytes: int | None = None
    cuda_allocated: int | None = None
    cuda_reserved: int | None = None
    node: int | None = None
    host: str | None = None
    pid: int | None = None
    rank: int = 0
    t_rel: float = 0.0

    def memory(self) -> MemoryReading:
        """Its memory figures."""
        return MemoryReading(rss=self.rss, tensor_bytes=self.tensor_bytes,
                             cuda_allocated=self.cuda_allocated,
                             cuda_reserved=self.cuda_reserved)

    def row(self, *, wire: bool = False,
            last: bool = False) -> BeatRow:
        """The heartbeat as a flat row of the ``heartbeats`` table (without
        ``last``, the collective it is in, unless asked) or, ``wire``, as a rank
        sends it. The fields of parts the rank does not run (recorder, stepper,
        several nodes) are left out, as the rank leaves them out."""
        out = msgspec.to_builtins(self)
        for key in _OPTIONAL_BEAT_FIELDS:
            if out.get(key) is None:
                out.pop(key, None)
        if wire:
            del out["rank"], out["t_rel"]
        if not (wire or last):
            out.pop("last", None)
        return out


def decode_message(value: Any, kind: type[msgspec.Struct]) -> Any:
    """``value`` (decoded JSON) as a ``kind``; None when it is not one."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError:
        return None


class RankInfo(msgspec.Struct, kw_only=True):
    """One rank's latest start as the collector holds it: its hello, with which
    slot and start it is, how long it has been silent (collector clock), its
    newest heartbeat and goodbye, and how many records it sent."""

    rank: int
    node: int | None = None
    host: str | None = None
    pid: int | None = None
    local_rank: int | None = None
    restart: int | None = None
    device: str | None = None
    shared_run_dir: bool | None = None
    run_dir: str | None = None
    elastic_run_id: str | None = None
    t: float | None = None
    slot: int | None = None
    #: which start of the rank this is (0: the first)
    incarnation: int = 0
    silent_s: float = 0.0
    bye: Bye | None = None
    heartbeat: Heartbeat = Heartbeat()
    steps_sent: int | None = None
    summaries_sent: int | None = None
    #: step batches and summaries lost to a full ring before the collector read them
    overwritten: list[int] = []


class Incarnation(msgspec.Struct, kw_only=True):
    """One attached process (a rank, or a restart of it), in slot order: what
    ``analysis.ranks.restarts`` groups restarts by."""

    rank: int
    slot: int | None = None
    incarnation: int = 0
    #: its agent's TORCHELASTIC_RESTART_COUNT
    restart_count: int | None = None
    node: int | None = None
    host: str | None = None
    world_size: int | None = None
    t: float | None = None  # its hello
    first_t: float | None = None
    last_t: float | None = None
    steps: int | None = None
    steps_done: int | None = None
    last_beat: float | None = None
    bye: Bye | None = None


class SilentSpell(msgspec.Struct, kw_only=True):
    """A time a rank's heartbeats stopped and came back (``kill -STOP`` then
    ``-CONT``, a swapped-out host): measured by the collector, judged by
    ``analysis.ranks.silence``. ``t``: the collector's wall clock at its last
    heartbeat before the spell; ``step``: the step it was in then (its
    heartbeat's ``steps_done``), ``step_after``: in its first one after.
    ``longest``: per other rank, its longest step record that overlaps the
    spell (s); ``within``: per other rank, its steps that began and ended
    inside the spell (a rank that went on makes some, a waiting one none)."""

    rank: int
    slot: int
    t: float
    silent_s: float
    step: int | None = None
    step_after: int | None = None
    longest: dict[int, float] = {}
    within: dict[int, int] = {}


class RankSnapshot(msgspec.Struct, kw_only=True):
    """What the collector holds now: the latest start of every rank (None: not
    attached yet), their kept step records and summary heads, and the
    collector's counts."""

    world_size: int
    ranks: list[RankInfo | None] = []
    steps: list[list[StepRecord]] = []
    summaries: list[list[StepSummary]] = []
    run_id: str | None = None
    dropped: int = 0
    dropped_why: dict[str, int] = {}
    incarnations: list[Incarnation] = []
    pending_slots: int = 0
    t0: float | None = None
    wall_s: float | None = None
    lost_after_s: float = 10.0
    #: every rank's silent spells, oldest first (``SilentSpell``)
    spells: list[SilentSpell] = []

    @classmethod
    def of(cls, snap: RankSnapshot | dict[str, Any]) -> RankSnapshot:
        """A snapshot from the collector, or one built as JSON builtins."""
        return snap if isinstance(snap, RankSnapshot) else msgspec.convert(snap, cls)
