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

What it trusts: only values sealed with the run's key. The unsigned ``slots``
counter (``protocol.slots_key``) is never read: which slots exist comes from
each rank's signed roster (``protocol.roster_key``), looked for at ranks 0 up
to the world size the ranks' own hellos say (the first ``FIRST_RANKS``
before any has said it). So a key nobody signed (a moved
counter, junk under any name) changes nothing the collector does: it is
either never read or dropped and counted (``dropped_why``), never followed.
Every per-run structure has a bound:

- ranks: ``protocol.MAX_WORLD`` (65,536) rosters looked for; a rank's roster
  holds its newest ``protocol.ROSTER_SLOTS`` (64) slots and the collector
  takes at most ``MAX_SLOTS_PER_RANK`` (256) slots of one rank;
- keys read a poll: the rosters (one ``check`` when all exist, else at most
  ``ROSTER_CHECKS_PER_POLL`` (256) single checks), ``HELLOS_PER_POLL`` hellos,
  one heartbeat per live slot and the ring values its heartbeat counts
  (at most ``protocol.RING`` a kind);
- bytes: a value over its kind's limit (``MAX_BYTES``: 64 KiB for a roster,
  hello or heartbeat, 4 MiB for a step batch or summary: the
  store itself refuses a value over 8 MiB) is dropped as
  ``oversized`` unopened; memory per slot is ``KEEP_STEPS`` records and
  ``KEEP_SUMMARIES`` summary heads; ``MAX_SPELLS`` (64) silent spells a run.

What the store itself holds is torch's ``TCPStore``: anyone who reaches the
port can set keys there that no one reads, and it keeps them (no limit of
its own). The collector never reads them; every ``KEYS_CHECK_S`` it compares
the store's key count with the most this run can hold and counts the rest
as ``unread keys`` (docs/SECURITY.md).

Freshness: a heartbeat carries its number (``beat``) inside its seal; one
not newer than the last accepted of its slot is dropped as ``replayed``
and does not count as a sign of life, so a genuine old heartbeat set again
cannot keep a stopped rank "running". Ring values carry their ``seq``.

Falling behind: step records are never lost to a slow collector. Every
``ACK_BATCHES`` step batches it reads of a slot, the collector seals the count
under the slot's ``read`` key (``protocol.read_key``, one ``multi_set`` a poll
for every slot due); a rank writes a step batch only over a ring value read
(``attach.StepRing``) and otherwise holds its records and sends them in larger
batches later; at exit it leaves what it still holds in its ``last`` keys
(``protocol.last_key``, counted by its goodbye), read after the goodbye, so it
never waits for the collector. What a rank shed past its hold is counted
(``Heartbeat.shed``). Profiled-step
summaries (~50 KB each, a ring of 4) follow the same word, but are not held:
one made while its ring is full of unread ones is not sent and is counted
(``Heartbeat.skipped``). They are what a starved collector cannot keep up with: when a
poll finds a slot ``SUMMARIES_BEHIND`` or more summaries past its last read,
the collector doubles its ``stride`` (up to ``MAX_STRIDE``) and from the next
poll reads summary number j of each slot only when ``j % stride == 0``; the
others are counted as sampled out (``Slot.sampled``), never read. The stride
halves after ``STRIDE_RELAX_S`` without such a poll. ``tally`` counts what was
sent, kept, sampled and overwritten, for the manifest and the run's last words.

Silent spells: a slot whose heartbeat stops for ``SPELL_S`` (5 s) or more
while the collector kept polling (``SPELL_POLLS``), then comes back, is
recorded (``model.messages.SilentSpell``) with what the other ranks did
meanwhile; ``analysis.ranks.silence`` says what it means.

Clocks: a rank's heartbeat age is measured on the collector's clock (when
its bytes last changed), so hosts with skewed clocks are judged alike.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey
from torchlens.capture.channel.store import host_store
from torchlens.formats.run_folder import spool as spool_files
from torchlens.formats.run_folder.manifest import CollectorEntry
from torchlens.model.messages import (
    Bye,
    Heartbeat,
    Hello,
    Incarnation,
    RankInfo,
    RankSnapshot,
    SilentSpell,
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
#: the kind of a step batch a rank left in its ``last`` keys at exit
LAST = 2
#: summaries: a poll that finds a slot this many past its last read (its ring
#: holds ``protocol.RING["prof"]``, 4) doubles the stride of the summaries read
#: (every stride-th of each slot), up to MAX_STRIDE; it halves after
#: STRIDE_RELAX_S without such a poll
SUMMARIES_BEHIND = 3
#: the collector tells a slot how far it has read once it read this many more
#: of its step batches (a quarter of its ring: the rank, which asks only when
#: its ring is full, then finds room)
ACK_BATCHES = 8
MAX_STRIDE = 64
STRIDE_RELAX_S = 10.0
#: keys per multi_get: the store answers one big multi_get much slower than
#: several small ones (1,024 values of 54 KB: 0.27 s in one call, 0.018 s in
#: calls of 64; benchmarks/bench_collector_parts.py)
CHUNK = 64
#: keys per multi_get of small values (heartbeats, rosters, step batches: ~0.3-2
#: KB each): a round trip each, and on a busy machine every round trip waits
#: for the store's thread to be scheduled, so fewer and larger (512 of 1.5 KB:
#: about as fast as 8 of 64 on a quiet machine)
SMALL_CHUNK = 512
#: new slots' hellos looked for in one poll
HELLOS_PER_POLL = 256
#: rosters of ranks not seen yet, checked one by one in a poll (when not all exist)
ROSTER_CHECKS_PER_POLL = 256
#: rosters looked for before any hello said the world size (rank 0 may never attach)
FIRST_RANKS = 8
#: how often the rosters of ranks already seen are read again (a restart adds a
#: slot): of those whose newest process ended or is quiet, and of every rank
ROSTER_S = 1.0
ROSTER_ALL_S = 10.0
#: slots taken from one rank's rosters over the run, at most
MAX_SLOTS_PER_RANK = 256
#: the largest value of each kind read; a larger one is dropped unopened
MAX_BYTES = {"roster": 64 << 10, "hello": 64 << 10, "hb": 64 << 10,
             "steps": 4 << 20, "prof": 4 << 20}
#: a heartbeat gap this long (s), over at least SPELL_POLLS polls, is a silent spell
SPELL_S = 5.0
SPELL_POLLS = 4
#: spells kept a run (the first ones; later ones are counted in ``spells_more``)
MAX_SPELLS = 64
#: how long after a spell ends the others' step records are still matched to it (s)
SPELL_WATCH_S = 60.0
#: how often the store's key count is compared with the most this run can have (s)
KEYS_CHECK_S = 5.0
#: keys of the run outside the slots and rosters, at most: the ``slots`` counter,
#: the live feed's frames (``feed.KEEP_FRAMES``) with its count, watchers and
#: announcement
RUN_KEYS = 70


def _append(path: str, data: bytes) -> None:
    """``data`` appended to the file ``path`` whole or not at all: a write cut
    short (a full disk) is cut back, so the next append starts a line."""
    with open(path, "ab", buffering=0) as fh:  # unbuffered: nothing left to flush on close
        end = fh.tell()
        view = memoryview(data)
        try:
            while view:
                view = view[fh.write(view):]
        except OSError:
            with contextlib.suppress(OSError):
                fh.truncate(end)
            raise


def _mark(value: bytes) -> bytes:
    """What is kept of a value to tell whether it changed: itself when small,
    else its digest (an oversized value is never kept)."""
    return value if len(value) <= 4096 else hashlib.blake2b(value, digest_size=16).digest()


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
    raw_hb: bytes = b""  # its last heartbeat value read (``_mark``)
    #: step batches and summaries the collector told it were read (``_acknowledge``)
    acked: list[int] = field(default_factory=lambda: [0, 0])
    counts: list[int] = field(default_factory=lambda: [0, 0])  # step records, summaries
    overwritten: list[int] = field(default_factory=lambda: [0, 0])  # lost to a full ring
    sampled: int = 0  # summaries not read: not a multiple of the stride (``Collector.stride``)
    #: the first step record's t0 and the last one's t1 (the kept records are
    #: only the newest: these say when this incarnation stepped at all)
    first_t: float | None = None
    last_t: float | None = None
    #: window records before its first real step, and whether that came
    setup: int = 0
    stepped: bool = False
    #: the collector's poll count when its heartbeat last changed (a spell
    #: needs polls that found it silent, not a collector that paused)
    polls_at_seen: int = 0

    @property
    def rank(self) -> int:
        return self.hello.rank


class Collector:
    """Hosts the store and keeps what each slot sent."""

    def __init__(self, key: RunKey, host: str = "127.0.0.1", port: int = 0,
                 spool: str | None = None) -> None:

        self.key = key
        self.spool = spool
        #: step batches and summaries read but not written to the spool (a full
        #: disk, no descriptor left): missing from the run folder; the first error
        self.unspooled = [0, 0]
        self.spool_error: str | None = None
        if spool:
            os.makedirs(spool, exist_ok=True)
        self.store, self.sock = host_store(host, port, STORE_TIMEOUT_S)
        self.host = self.sock.getsockname()[0]
        self.port = int(self.sock.getsockname()[1])
        self.slots: dict[int, Slot] = {}
        self.pending: list[int] = []  # slots in a roster whose hello has not been read
        #: ranks whose rosters are looked for: 0 up to the world the hellos say
        self.world = 1
        self.world_said = False
        self.rosters: dict[int, bytes] = {}  # rank -> its roster as last read
        self.rank_slots: dict[int, set[int]] = {}  # rank -> slots its rosters named
        self.slot_rank: dict[int, int] = {}
        self._roster_t = self._roster_all_t = -float("inf")
        self._roster_turn = 0
        self.polls = 0
        self._keys_t = -float("inf")
        self.spells: list[SilentSpell] = []
        self.spells_more = 0
        self._watching: list[tuple[float, SilentSpell]] = []  # (until, spell)
        self.chan: protocol.Channel | None = protocol.Channel(self.store, key)
        self._dropped_why: dict[str, int] = {}  # beside the signature failures
        #: values of slots that said goodbye whose read failed: asked again next poll
        self._again: list[tuple[Slot, int, int]] = []
        self._forged = 0
        #: called as ``fn(slot, kind, values)`` with every step batch's records
        #: (kind 0: training steps, labelled spans and windows alike) and every
        #: summary head (kind 1) as it is kept, in arrival order: the live feed
        #: (``capture.ranks.feed``) takes what is new here, not from the newest
        #: ``KEEP_STEPS``, which hold less than a fast rank sends between frames
        self.listeners: list[Callable[[Slot, int, list[Any]], None]] = []
        self.t0 = time.time()
        #: summaries read: number j of a slot when j % stride == 0 (1: all)
        self.stride = self.stride_max = 1
        self._behind = False  # this poll found a slot SUMMARIES_BEHIND summaries behind
        self._behind_t = -float("inf")

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
        """Read everything new (three or four store round trips)."""
        self.polls += 1
        now = time.monotonic()
        self._count_keys(now)
        world = self.world if self.world_said else 0
        self._rosters(now)
        self._hellos()
        if self.world_said and self.world > world:  # a hello said how many ranks there are
            self._rosters(now)
            self._hellos()
        active = [s for s in self.slots.values() if s.bye is None]
        wanted, self._again = self._again, []
        if not active and not wanted:
            return
        names = [self._key(s.slot, "hb") for s in active]
        for s, name, hb in zip(active, names, self._get_there(names), strict=True):
            mark = _mark(hb)
            if mark == s.raw_hb or not hb:
                continue
            s.raw_hb = mark
            if self._oversized("hb", hb):
                continue
            value = self._open(name, hb)
            beat = decode_message(value, Heartbeat)
            if beat is None:
                continue
            if not isinstance(beat.beat, (int, float)):
                self._drop("heartbeat without its number")
                continue
            if s.heartbeat.beat is not None and beat.beat <= s.heartbeat.beat:
                # a genuine older heartbeat set again: no sign of life
                self._drop("replayed")
                continue
            self._spell(s, beat, now)
            s.heartbeat, s.seen, s.polls_at_seen = beat, now, self.polls
            wanted += self._new_values(s, beat.sent)
            if beat.bye is not None:
                s.bye = beat.bye  # it counts its last values: read in this poll
                last = beat.last if isinstance(beat.last, int) else 0
                wanted += [(s, LAST, j) for j in range(min(max(last, 0), protocol.LAST_KEYS))]
        self._read_values(wanted)
        self._acknowledge(active)
        self._pace(now)

    def _acknowledge(self, active: list[Slot]) -> None:
        """Seal, under each slot's ``read`` key, how many of its step batches and
        summaries are read, for the slots ``ACK_BATCHES`` batches or any summary
        past their last word."""
        due = [s for s in active if s.read[0] - s.acked[0] >= ACK_BATCHES
               or s.read[1] > s.acked[1]]
        if not due or self.chan is None:
            return
        names = [protocol.read_key(self.key.run_id, s.slot) for s in due]
        values = [self.chan.seal(n, {"steps": s.read[0], "prof": s.read[1]})
                  for n, s in zip(names, due, strict=True)]
        for i in range(0, len(names), CHUNK):
            self.store.multi_set(names[i:i + CHUNK], values[i:i + CHUNK])
        for s in due:
            s.acked = list(s.read)

    def _pace(self, now: float) -> None:
        """Double the summaries' stride after a poll that found a slot behind;
        halve it after ``STRIDE_RELAX_S`` without one."""
        if self._behind:
            self._behind, self._behind_t = False, now
            self.stride = min(2 * self.stride, MAX_STRIDE)
            self.stride_max = max(self.stride_max, self.stride)
        elif self.stride > 1 and now - self._behind_t >= STRIDE_RELAX_S:
            self.stride //= 2
            self._behind_t = now

    def _count_keys(self, now: float) -> None:
        """Keys in the store beyond the most this run can hold (its rosters; per
        slot a hello, a heartbeat, its read count, its rings and a profiling
        interval; the feed's):
        set by someone else, never read, counted as ``unread keys``. The
        store keeps them (torch's TCPStore has no limit): this says so."""
        if now - self._keys_t < KEYS_CHECK_S:
            return
        self._keys_t = now
        try:
            n = int(self.store.num_keys())
        except Exception:  # noqa: BLE001 - a store without the count: nothing to say
            return
        most = (RUN_KEYS + len(self.rosters)
                + len(self.slot_rank) * (4 + protocol.LAST_KEYS + sum(protocol.RING.values())))
        if n > most:
            self._dropped_why["unread keys"] = max(self._dropped_why.get("unread keys", 0),
                                                   n - most)

    def _oversized(self, kind: str, value: bytes) -> bool:
        if len(value) > MAX_BYTES[kind]:
            self._drop("oversized")
            return True
        return False

    # -- which slots exist: the signed rosters ----------------------------------
    def _rosters(self, now: float) -> None:
        """Find new slots in the ranks' rosters: the ones not seen yet (one
        ``check`` when all are there), and every ``ROSTER_S`` the ones seen (a
        restart adds a slot)."""
        run_id = self.key.run_id
        # before any hello said the world size, the first ranks: any of them says it
        span = self.world if self.world_said else max(self.world, FIRST_RANKS)
        missing = [r for r in range(span) if r not in self.rosters]
        found: list[int] = []
        if missing:
            if self.store.check([protocol.roster_key(run_id, r) for r in missing]):
                found = missing
            else:
                turn = self._roster_turn % len(missing)
                look = (missing[turn:] + missing[:turn])[:ROSTER_CHECKS_PER_POLL]
                self._roster_turn = turn + len(look)
                found = [r for r in look if self.store.check([protocol.roster_key(run_id, r)])]
        again: list[int] = []
        if now - self._roster_t >= ROSTER_S:
            # a restart adds a slot once the rank's last process ended or went
            # quiet: those ranks' rosters every ROSTER_S, every rank's now and then
            self._roster_t = now
            every = now - self._roster_all_t >= ROSTER_ALL_S
            if every:
                self._roster_all_t = now
            again = [r for r in self.rosters if every or not self._fresh(r, now)]
        ranks = found + again
        if not ranks:
            return
        names = [protocol.roster_key(run_id, r) for r in ranks]
        for r, name, raw in zip(ranks, names, self._get_there(names), strict=True):
            if self.rosters.get(r) == _mark(raw) or not raw:
                continue
            self.rosters[r] = _mark(raw)
            if self._oversized("roster", raw) or self.chan is None:
                continue
            slots = protocol.roster_slots(self.chan, name, raw)
            if slots is None:
                if self.chan.open_body(name, raw) is not None:
                    self._drop("not a roster")
                continue
            known = self.rank_slots.setdefault(r, set())
            new = [x for x in slots if x not in known]
            if not new and set(slots) < known:
                self._drop("replayed")  # an older roster set again: nothing new
            for slot in new:
                if len(known) >= MAX_SLOTS_PER_RANK:
                    self._drop("too many slots")
                    break
                known.add(slot)
                if slot not in self.slot_rank:
                    self.slot_rank[slot] = r
                    self.pending.append(slot)

    def _new_values(self, s: Slot, sent: Any) -> list[tuple[Slot, int, int]]:
        """(slot, kind, number) of the values ``s`` sent since the last read that its rings hold."""
        if not (isinstance(sent, list) and len(sent) == 2
                and all(isinstance(x, int) for x in sent)):
            return []
        out = []
        for kind, count in enumerate(sent):
            first = max(s.read[kind], count - protocol.RING[KINDS[kind]])
            s.overwritten[kind] += max(0, first - s.read[kind])
            numbers = range(first, count)
            if kind == 1:
                self._behind = self._behind or count - s.read[1] >= SUMMARIES_BEHIND
                if self.stride > 1:
                    numbers = range(first + -first % self.stride, count, self.stride)
                    s.sampled += count - first - len(numbers)
            out += [(s, kind, j) for j in numbers]
            s.read[kind] = max(s.read[kind], count)
        return out

    def _multi_get(self, names: list[str], chunk: int = CHUNK) -> list[Any]:
        out: list[Any] = []
        for i in range(0, len(names), chunk):
            out += self.store.multi_get(names[i:i + chunk])
        return out

    def _get_there(self, names: list[str], chunk: int = SMALL_CHUNK) -> list[bytes]:
        """Values of keys that should exist; b"" for one someone deleted (then
        key by key: ``multi_get`` fails on a missing key, after a wait)."""
        try:
            return [bytes(v) for v in self._multi_get(names, chunk)]
        except Exception:  # noqa: BLE001 - a key someone else deleted
            if self.store.check(names):
                # every key is there: the store was too busy to answer in time,
                # and key by key would take two round trips a key
                raise
            return [bytes(self.store.get(k)) if self.store.check([k]) else b"" for k in names]

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
                if self._oversized("hello", bytes(value)):
                    continue
                body = self._open(name, value)
                hello = decode_message(body, Hello)
                if hello is None or hello.rank != self.slot_rank.get(slot):
                    if body is not None:
                        self._drop("bad hello")
                    continue
                self.slots[slot] = Slot(slot, hello, time.monotonic(),
                                        polls_at_seen=self.polls)
                if self.spool:  # what a folder rebuilt from the spool names the slot by
                    with contextlib.suppress(OSError):
                        spool_files.write_hello(self.spool, slot, hello)
                if isinstance(hello.world_size, int):
                    self.world = max(self.world, min(hello.world_size, protocol.MAX_WORLD))
                    self.world_said = True
        self.pending = still + self.pending[HELLOS_PER_POLL:]

    def _fresh(self, rank: int, now: float) -> bool:
        """``rank``'s newest slot is read and beating (no goodbye, heard of lately)."""
        slots = self.rank_slots.get(rank)
        s = self.slots.get(max(slots)) if slots else None
        return s is not None and s.bye is None and now - s.seen < 2 * ROSTER_S

    # -- silent spells -----------------------------------------------------------
    def _spell(self, s: Slot, beat: Heartbeat, now: float) -> None:
        """Record a spell when ``s``'s heartbeat comes back after ``SPELL_S`` or
        more of silence that the collector watched (``SPELL_POLLS`` polls)."""
        gap = now - s.seen
        if gap < SPELL_S or self.polls - s.polls_at_seen < SPELL_POLLS:
            return
        if len(self.spells) >= MAX_SPELLS:
            self.spells_more += 1
            return
        start = time.time() - gap
        spell = SilentSpell(rank=s.rank, slot=s.slot, t=start, silent_s=gap,
                            step=s.heartbeat.steps_done, step_after=beat.steps_done)
        self.spells.append(spell)
        # the others' records already here; later ones as they come (``_take``)
        for other in self.slots.values():
            if other.rank != s.rank:
                self._match(spell, other.rank, other.steps)
        self._watching.append((now + SPELL_WATCH_S, spell))

    @staticmethod
    def _match(spell: SilentSpell, rank: int, records: list[StepRecord]) -> None:
        a, b = spell.t, spell.t + spell.silent_s
        for r in records:
            if r.t0 is None or r.t1 is None or r.t1 <= a or r.t0 >= b:
                continue
            spell.longest[rank] = max(spell.longest.get(rank, 0.0), r.t1 - r.t0)
            if r.t0 >= a and r.t1 <= b and not r.labelled:
                spell.within[rank] = spell.within.get(rank, 0) + 1

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
        # step batches first, in large chunks; then the summaries (~50 KB each)
        # (kind LAST: a step batch a rank left in its ``last`` keys at exit)
        wanted = sorted(wanted, key=lambda w: w[1] == 1)
        names = [protocol.last_key(self.key.run_id, s.slot, j) if kind == LAST
                 else protocol.ring_key(self.key.run_id, s.slot, KINDS[kind], j)
                 for s, kind, j in wanted]
        batches = sum(kind != 1 for _, kind, _ in wanted)
        try:
            values = (self._get_there(names[:batches])
                      + self._get_there(names[batches:], CHUNK))
        except Exception:
            self._unread(wanted)
            raise
        spooled: dict[tuple[int, int], list[bytes]] = {}
        for (s, at, j), name, value in zip(wanted, names, values, strict=True):
            kind = 0 if at == LAST else at
            if self._oversized(KINDS[kind], value):
                continue
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
                self._drop("replayed")
                continue
            line = self._take(s, kind, head, payload)
            if line is not None:
                spooled.setdefault((s.slot, kind), []).append(line)
        for (slot, kind), lines in spooled.items():
            path = self.spool_path(slot, kind)
            if path is None:
                continue
            try:
                _append(path, b"".join(line.replace(b"\n", b" ") + b"\n" for line in lines))
            except OSError as exc:  # counted and said at the end; the live view goes on
                self.unspooled[kind] += len(lines)
                self.spool_error = self.spool_error or f"{type(exc).__name__}: {exc}"

    def _unread(self, wanted: list[tuple[Slot, int, int]]) -> None:
        """A read that failed (a store too busy to answer in ``STORE_TIMEOUT_S``):
        its values count as not read yet, so the slot's next heartbeat asks for
        them again while its ring holds them (and the ones the stride skipped
        among them are not counted twice)."""
        # a slot that said goodbye sends no next heartbeat: its values are asked again as they are
        self._again += [w for w in wanted if w[0].bye is not None]
        first: dict[tuple[int, int], tuple[Slot, int, int]] = {}  # (slot, kind) -> (s, j, n)
        for s, kind, j in wanted:
            if s.bye is not None:
                continue
            _, low, n = first.get((s.slot, kind), (s, j, 0))
            first[(s.slot, kind)] = (s, min(low, j), n + 1)
        for (_, kind), (s, low, n) in first.items():
            if kind == 1:
                s.sampled -= s.read[1] - low - n
            s.read[kind] = min(s.read[kind], low)

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
        if self._watching:
            now = time.monotonic()
            self._watching = [(until, sp) for until, sp in self._watching if until > now]
            for _, spell in self._watching:
                if spell.rank != s.rank:
                    self._match(spell, s.rank, records)
        s.steps += records
        del s.steps[:-KEEP_STEPS]
        self._tell(s, 0, records)
        return payload

    def _tell(self, s: Slot, kind: int, values: list[Any]) -> None:
        for fn in self.listeners:
            fn(s, kind, values)

    # -- state ---------------------------------------------------------------
    def tally(self) -> CollectorEntry:
        """What the ranks sent and what was kept, sampled out or overwritten,
        over every slot (its ``words`` left for the analysis to say)."""
        slots = list(self.slots.values())
        return CollectorEntry(
            step_batches_sent=sum(s.read[0] for s in slots),
            step_batches_overwritten=sum(s.overwritten[0] for s in slots),
            step_records_kept=sum(s.counts[0] for s in slots),
            step_records_shed=sum(s.heartbeat.shed or 0 for s in slots),
            summaries_sent=sum(s.read[1] for s in slots),
            summaries_kept=sum(s.counts[1] for s in slots),
            summaries_sampled=sum(s.sampled for s in slots),
            summaries_overwritten=sum(s.overwritten[1] for s in slots),
            summaries_skipped=sum(s.heartbeat.skipped or 0 for s in slots),
            stride_max=self.stride_max, summaries_behind_at=SUMMARIES_BEHIND,
            summaries_ring=protocol.RING["prof"])

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
            wall_s=time.time() - self.t0, lost_after_s=LOST_S, spells=list(self.spells))

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
