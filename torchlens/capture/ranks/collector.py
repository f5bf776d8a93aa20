"""The collector of ``torchlens run``: a TCPStore the ranks of a torchrun job report to.

It hosts the store (on a socket it binds itself, so it listens on loopback
unless told otherwise: ``TCPStore`` alone would listen on every interface),
and on each ``poll()`` reads what the attached ranks sent
(``capture.ranks.attach``; key names in ``protocol``): which slots exist, each
new slot's hello, then one ``multi_get`` of every slot's heartbeat and, for
the slots whose heartbeat changed, one ``multi_get`` of the step batches and
summaries it counts as sent (``sent``) since the last read. Those sit in
rings of keys (``protocol.RING``), so the store holds a bounded number of
values a slot however far behind the collector is, and nothing is deleted;
a value overwritten before it was read is counted (``overwritten``), never
waited for.

Every value is opened with the run's key before it is decoded; a value that
fails (forged, or of another run) is dropped and counted, never decoded. A
step batch is decoded once, into ``model.records.StepRecord``s (an item that
is not one is dropped and counted). A summary is decoded only in its head (``protocol.SUMMARY_KEYS``: what the
live view reads, ~300 bytes): the rest (~50 KB of timeline ops) is verified
and written to the spool as received.

Memory stays bounded however long the run and however many ranks: each slot
keeps its newest ``KEEP_STEPS`` step records and ``KEEP_SUMMARIES`` summary
heads, with counts of all it sent. Everything, in full, goes to the spool
folder when there is one (``torchlens run``'s run folder): one JSON line per
step batch and per summary, appended as it arrives (``spool_lines``).
benchmarks/bench_collector_load.py measures it.

Clocks: a rank's heartbeat age is measured on the collector's clock (when
its bytes last changed), so hosts with skewed clocks are judged alike.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey
from torchlens.capture.channel.store import host_store
from torchlens.model.messages import (
    Bye,
    Heartbeat,
    Hello,
    Incarnation,
    RankInfo,
    RankSnapshot,
    decode_message,
)
from torchlens.model.records import StepRecord, StepSummary, decode_batch

#: a slot whose heartbeat has not changed for this long stopped sending
LOST_S = 10.0
#: how long a read of a key that is not there blocks (only a key deleted by
#: someone else, who can reach the port, is missing)
STORE_TIMEOUT_S = 2.0
#: step records and summaries kept in memory per slot (all of them go to the
#: spool). The live summary reads these: the slow rank over the last 20 steps,
#: memory creep over all 64. At 1,024 ranks the analysis of this window takes
#: 0.3 s a frame, of 256 records 0.8 s (benchmarks/bench_collector_parts.py)
KEEP_STEPS = 64
KEEP_SUMMARIES = 16
KINDS = ("steps", "prof")
#: keys per multi_get: the store answers one big multi_get much slower than
#: several small ones (1,024 values of 54 KB: 0.27 s in one call, 0.018 s in
#: calls of 64; benchmarks/bench_collector_parts.py)
CHUNK = 64
#: new slots' hellos looked for in one poll
HELLOS_PER_POLL = 256


@dataclass
class Slot:
    """One attached process: a rank, or a restart of it (a new slot, a new *incarnation*)."""

    slot: int
    hello: Hello
    seen: float  # collector clock: when its heartbeat last changed
    heartbeat: Heartbeat = field(default_factory=Heartbeat)
    steps: list[StepRecord] = field(default_factory=list)
    #: the summary heads as received (JSON builtins, passed on to the live feed
    #: as they came) and the same decoded once, for the analysis
    summaries: list[dict[str, Any]] = field(default_factory=list)
    typed: list[StepSummary] = field(default_factory=list)
    bye: Bye | None = None
    read: list[int] = field(default_factory=lambda: [0, 0])  # values read: batches, summaries
    raw_hb: bytes = b""
    counts: list[int] = field(default_factory=lambda: [0, 0])  # step records, summaries
    overwritten: list[int] = field(default_factory=lambda: [0, 0])  # lost to a full ring
    #: the first step record's t0 and the last one's t1 (the kept records are
    #: only the newest: these say when this incarnation stepped at all)
    first_t: float | None = None
    last_t: float | None = None
    #: window records before its first real step, and whether that came
    setup: int = 0
    stepped: bool = False

    @property
    def rank(self) -> int:
        return self.hello.rank


class Collector:
    """Hosts the store and keeps what each slot sent."""

    def __init__(self, key: RunKey, host: str = "127.0.0.1", port: int = 0,
                 spool: str | None = None) -> None:

        self.key = key
        self.spool = spool
        if spool:
            os.makedirs(spool, exist_ok=True)
        self.store, self.sock = host_store(host, port, STORE_TIMEOUT_S)
        self.host = self.sock.getsockname()[0]
        self.port = int(self.sock.getsockname()[1])
        self.slots: dict[int, Slot] = {}
        self.pending: list[int] = []  # slots taken whose hello has not come
        self.known = 0
        self.chan: protocol.Channel | None = protocol.Channel(self.store, key)
        self._dropped_why: dict[str, int] = {}  # beside the signature failures
        self._forged = 0
        #: called as ``fn(slot, kind, values)`` with every step batch's records
        #: (kind 0: training steps, labelled spans and windows alike) and every
        #: summary head (kind 1) as it is kept, in arrival order: the live feed
        #: (``capture.ranks.feed``) takes what is new here, not from the newest
        #: ``KEEP_STEPS``, which hold less than a fast rank sends between frames
        self.listeners: list[Callable[[Slot, int, list[Any]], None]] = []
        self.t0 = time.time()

    def close(self) -> None:
        self._forged = self._signature_drops()  # kept past the channel
        self.store = self.chan = None  # the server stops with its last reference
        with contextlib.suppress(OSError):
            self.sock.close()

    @property
    def dropped_why(self) -> dict[str, int]:
        """Dropped messages by reason (signature failures counted by the channel)."""
        forged = self._signature_drops()
        return {**({"bad signature": forged} if forged else {}), **self._dropped_why}

    def _signature_drops(self) -> int:
        return sum(self.chan.dropped.values()) if self.chan is not None else self._forged

    @property
    def dropped(self) -> int:
        return sum(self.dropped_why.values())

    def _drop(self, why: str, n: int = 1) -> None:
        if n:
            self._dropped_why[why] = self._dropped_why.get(why, 0) + n

    def _open(self, name: str, value: Any) -> Any:
        """The decoded JSON of a value sealed for ``name``; None (counted) when it
        is not ours or not JSON."""
        body = self.chan.open_body(name, value) if self.chan is not None else None
        if body is None:
            return None
        try:
            return protocol.decode(body)
        except ValueError:
            self._drop("not JSON")
            return None

    def _key(self, slot: int, what: str) -> str:
        return protocol.slot_key(self.key.run_id, slot, what)

    # -- polling ---------------------------------------------------------------
    def poll(self) -> None:
        """Read everything new (two or three store round trips)."""
        n = int(self.store.add(protocol.slots_key(self.key.run_id), 0))
        self.pending += range(self.known, n)
        self.known = max(self.known, n)
        self._hellos()
        active = [s for s in self.slots.values() if s.bye is None]
        if not active:
            return
        names = [self._key(s.slot, "hb") for s in active]
        now = time.monotonic()
        wanted: list[tuple[Slot, int, int]] = []
        for s, name, value in zip(active, names, self._multi_get(names), strict=True):
            hb = bytes(value)
            if hb == s.raw_hb:
                continue
            s.raw_hb, s.seen = hb, now
            value = self._open(name, hb)
            beat = decode_message(value, Heartbeat)
            if beat is None:
                continue
            s.heartbeat = beat
            wanted += self._new_values(s, beat.sent)
            if beat.bye is not None:
                s.bye = beat.bye  # it counts its last values: read in this poll
        self._read_values(wanted)

    def _new_values(self, s: Slot, sent: Any) -> list[tuple[Slot, int, int]]:
        """(slot, kind, number) of the values ``s`` sent since the last read that its rings hold."""
        if not (isinstance(sent, list) and len(sent) == 2
                and all(isinstance(x, int) for x in sent)):
            return []
        out = []
        for kind, count in enumerate(sent):
            first = max(s.read[kind], count - protocol.RING[KINDS[kind]])
            s.overwritten[kind] += max(0, first - s.read[kind])
            out += [(s, kind, j) for j in range(first, count)]
            s.read[kind] = max(s.read[kind], count)
        return out

    def _multi_get(self, names: list[str]) -> list[Any]:
        out: list[Any] = []
        for i in range(0, len(names), CHUNK):
            out += self.store.multi_get(names[i:i + CHUNK])
        return out

    def _hellos(self) -> None:
        """Register the pending slots whose hello has come: one ``check`` and one
        ``multi_get`` per chunk when they all have (the usual case at start-up)."""
        still: list[int] = []
        looked = self.pending[:HELLOS_PER_POLL]
        for i in range(0, len(looked), CHUNK):
            chunk = looked[i:i + CHUNK]
            names = [self._key(slot, "hello") for slot in chunk]
            if not self.store.check(names):
                here = [self.store.check([n]) for n in names]
                still += [slot for slot, ok in zip(chunk, here, strict=True) if not ok]
                chunk = [slot for slot, ok in zip(chunk, here, strict=True) if ok]
                names = [n for n, ok in zip(names, here, strict=True) if ok]
            for slot, name, value in zip(chunk, names, self._multi_get(names), strict=True):
                body = self._open(name, value)
                hello = decode_message(body, Hello)
                if hello is None:
                    if body is not None:
                        self._drop("bad hello")
                    continue
                self.slots[slot] = Slot(slot, hello, time.monotonic())
        self.pending = still + self.pending[HELLOS_PER_POLL:]

    def spool_path(self, slot: int, kind: int) -> str | None:
        """The spool file of ``slot``'s step batches (kind 0) or summaries (kind 1)."""
        if not self.spool:
            return None
        return os.path.join(self.spool, f"slot{slot}.{('steps', 'summaries')[kind]}.jsonl")

    def spool_lines(self, slot: int, kind: int) -> list[bytes]:
        """Everything ``slot`` sent of one kind, one JSON body a line (a step batch is a list)."""
        path = self.spool_path(slot, kind)
        if path is None or not os.path.exists(path):
            return []
        with open(path, "rb") as fh:
            return [line for line in fh.read().split(b"\n") if line]

    def _read_values(self, wanted: list[tuple[Slot, int, int]]) -> None:
        if not wanted:
            return
        names = [protocol.ring_key(self.key.run_id, s.slot, KINDS[kind], j)
                 for s, kind, j in wanted]
        try:
            values = [bytes(v) for v in self._multi_get(names)]
        except Exception:  # noqa: BLE001 - a key someone else deleted: key by key
            values = [bytes(self.store.get(k)) if self.store.check([k]) else b""
                      for k in names]
        spooled: dict[tuple[int, int], list[bytes]] = {}
        for (s, kind, j), name, value in zip(wanted, names, values, strict=True):
            body = self.chan.open_body(name, value) if value and self.chan else None
            if body is None:
                if not value:
                    self._drop("missing value")
                continue
            try:
                head, payload = protocol.unpack(body)
            except ValueError:
                self._drop("not a numbered value")
                continue
            if head["seq"] > j:  # the rank ran a ring ahead before this read
                s.overwritten[kind] += 1
                continue
            if head["seq"] < j:  # an older value set again: a replay
                self._drop("replayed value")
                continue
            line = self._take(s, kind, head, payload)
            if line is not None:
                spooled.setdefault((s.slot, kind), []).append(line)
        for (slot, kind), lines in spooled.items():
            path = self.spool_path(slot, kind)
            if path is not None:
                with open(path, "ab") as fh:
                    fh.write(b"".join(line.replace(b"\n", b" ") + b"\n" for line in lines))

    def _take(self, s: Slot, kind: int, head: dict[str, Any], payload: bytes) -> bytes | None:
        """Keep one value in ``s``; its spool line (``None`` when it is not what it says)."""
        if kind == 1:
            s.counts[1] += 1
            summary = {k: v for k, v in head.items() if k != "seq"}
            # spooled as received either way; the analysis skips a head that is no summary
            with contextlib.suppress(msgspec.ValidationError):
                s.typed.append(StepSummary.of(summary))
                del s.typed[:-KEEP_SUMMARIES]
            s.summaries.append(summary)
            del s.summaries[:-KEEP_SUMMARIES]
            self._tell(s, 1, s.summaries[-1:])
            return protocol.merge_summary(head, payload)
        try:
            records, bad = decode_batch(payload)
        except ValueError:
            self._drop("not JSON")
            return None
        self._drop("not a step record", bad)
        # training steps only: an evaluation or a checkpoint span (``label``) is not one
        s.counts[0] += sum(not r.labelled for r in records)
        if records:
            if s.first_t is None:
                s.first_t = records[0].t0
            s.last_t = records[-1].t1
        real = [r for r in records if not r.window]
        if real and not s.stepped:
            # its windows so far were its set-up (``model.records.without_setup``):
            # not steps it made, and it began stepping at its first real step
            s.stepped = True
            s.counts[0] -= s.setup + len(records) - len(real)
            s.first_t = real[0].t0
        elif not s.stepped:
            s.setup += len(records)
        s.steps += records
        del s.steps[:-KEEP_STEPS]
        self._tell(s, 0, records)
        return payload

    def _tell(self, s: Slot, kind: int, values: list[Any]) -> None:
        for fn in self.listeners:
            fn(s, kind, values)

    # -- state ---------------------------------------------------------------
    def snapshot(self) -> RankSnapshot:
        """What the analysis judges: the latest incarnation of every rank."""
        now = time.monotonic()
        latest: dict[int, Slot] = {}
        start: dict[int, int] = {}
        for n, s in self.numbered_slots():  # in slot order: the last one of a rank is its latest
            latest[s.rank], start[s.rank] = s, n
        world = max([s.hello.world_size or 0 for s in self.slots.values()]
                    + [max(latest, default=-1) + 1])
        ranks: list[RankInfo | None] = []
        for r in range(world):
            s = latest.get(r)
            if s is None:
                ranks.append(None)
                continue
            h = s.hello
            ranks.append(RankInfo(
                rank=h.rank, node=h.node, host=h.host, pid=h.pid, local_rank=h.local_rank,
                restart=h.restart, device=h.device, shared_run_dir=h.shared_run_dir,
                run_dir=h.run_dir, elastic_run_id=h.elastic_run_id, t=h.t,
                slot=s.slot, incarnation=start[r], silent_s=now - s.seen, bye=s.bye,
                heartbeat=s.heartbeat, steps_sent=s.counts[0], summaries_sent=s.counts[1],
                overwritten=list(s.overwritten)))
        steps = [latest[r].steps if r in latest else [] for r in range(world)]
        summaries = [latest[r].typed if r in latest else [] for r in range(world)]
        return RankSnapshot(
            run_id=self.key.run_id, world_size=world, ranks=ranks, steps=steps,
            summaries=summaries, dropped=self.dropped, dropped_why=dict(self.dropped_why),
            incarnations=self.incarnations(), pending_slots=len(self.pending), t0=self.t0,
            wall_s=time.time() - self.t0, lost_after_s=LOST_S)

    def all_slots(self) -> list[Slot]:
        return sorted(self.slots.values(), key=lambda s: s.slot)

    def numbered_slots(self) -> list[tuple[int, Slot]]:
        """Every slot in slot order, with which start of its rank it is (0: the
        first; a later process of the same rank is a restart of it, whatever its
        ``TORCHELASTIC_RESTART_COUNT``: ``incarnations`` says why)."""
        seen: dict[int, int] = {}
        out = []
        for s in self.all_slots():
            seen[s.rank] = seen.get(s.rank, -1) + 1
            out.append((seen[s.rank], s))
        return out

    def incarnations(self) -> list[Incarnation]:
        """Every attached process in slot order, with what ``analysis.ranks.restarts``
        needs to group restarts: which start of its rank it is, when it stepped,
        and how it ended (its goodbye).

        A later process of the same rank is a restart of it, whatever its
        ``TORCHELASTIC_RESTART_COUNT``: an agent counts only its own node's
        failures, so a node restarted because another node failed keeps 0.
        """
        return [Incarnation(rank=s.rank, slot=s.slot, incarnation=n,
                            restart_count=s.hello.restart, node=s.hello.node,
                            host=s.hello.host, world_size=s.hello.world_size, t=s.hello.t,
                            first_t=s.first_t, last_t=s.last_t, steps=s.counts[0],
                            steps_done=s.heartbeat.steps_done, last_beat=s.heartbeat.t,
                            bye=s.bye)
                for n, s in self.numbered_slots()]
