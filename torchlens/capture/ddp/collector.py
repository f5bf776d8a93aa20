"""The collector of ``torchlens run``: a TCPStore the ranks of a torchrun job report to.

It hosts the store (on a socket it binds itself, so it listens on loopback
unless told otherwise: ``TCPStore`` alone would listen on every interface),
and on each ``poll()`` reads what the attached ranks sent
(``capture.ddp.attach``; key names in ``protocol``): which slots exist, each
new slot's hello, then one ``multi_get`` for every slot's heartbeat and
counters and one for the new step batches and summaries, deleting what it
read so the store stays small however long the run.

Every value is opened with the run's key before it is decoded; a value that
fails (forged, or of another run) is dropped and counted, never decoded.
Counters cannot be signed (``store.add``): a forged counter costs at most
``MAX_READ`` reads of keys that are not there, each counted as dropped.

Memory stays bounded however long the run and however many ranks: each slot
keeps its newest ``KEEP_STEPS`` step records and ``KEEP_SUMMARIES`` summaries
(cut to ``SUMMARY_KEYS``, what the live view reads: a full summary decodes to
~200 KB of Python objects), with counts of all it sent. Everything, in full,
goes to the spool folder when there is one (``torchlens run``'s run folder):
each value's JSON body as received, one line per value, appended as it
arrives (``spool_lines``). benchmarks/bench_collector_load.py measures it.

Clocks: a rank's heartbeat age is measured on the collector's clock (when
its bytes last changed), so hosts with skewed clocks are judged alike.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

from . import protocol
from .signing import RunKey
from .store import host_store

#: a slot whose heartbeat has not changed for this long stopped sending
LOST_S = 10.0
#: new values read per slot and kind in one poll (bounds a forged counter)
MAX_READ = 64
#: how long a read of a key that is not there blocks (only forged counters do)
STORE_TIMEOUT_S = 2.0
#: step records and summaries kept in memory per slot (all of them go to the spool)
KEEP_STEPS = 256
KEEP_SUMMARIES = 16
#: the parts of a summary kept in memory (``analysis.rank_steps`` reads these)
SUMMARY_KEYS = ("rank", "step", "trace", "t0", "t1", "step_ms", "breakdown", "memory",
                "events", "bytes")


@dataclass
class Slot:
    """One attached process (a rank; a restarted rank is a new slot)."""

    slot: int
    hello: dict[str, Any]
    seen: float  # collector clock: when its heartbeat last changed
    heartbeat: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)
    bye: dict[str, Any] | None = None
    superseded: bool = False  # a later restart of the same rank took over
    read: list[int] = field(default_factory=lambda: [0, 0])
    raw_hb: bytes = b""
    counts: list[int] = field(default_factory=lambda: [0, 0])  # step records, summaries

    @property
    def rank(self) -> int:
        return int(self.hello["rank"])


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
        self.restarts: list[dict[str, Any]] = []
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

    def _drop(self, why: str) -> None:
        self._dropped_why[why] = self._dropped_why.get(why, 0) + 1

    def _open_body(self, name: str, value: Any) -> tuple[bytes | None, Any]:
        """The body as received and its decoded JSON; ``(None, None)`` (counted)
        when it is not ours or not JSON."""
        body = self.chan.open_body(name, value) if self.chan is not None else None
        if body is None:
            return None, None
        try:
            return body, protocol.decode(body)
        except ValueError:
            self._drop("not JSON")
            return None, None

    def _open(self, name: str, value: Any) -> Any:
        return self._open_body(name, value)[1]

    def _key(self, slot: int, what: str) -> str:
        return protocol.slot_key(self.key.run_id, slot, what)

    # -- polling ---------------------------------------------------------------
    def poll(self) -> None:
        """Read everything new (a few store round trips)."""
        n = int(self.store.add(protocol.slots_key(self.key.run_id), 0))
        self.pending += range(self.known, n)
        self.known = max(self.known, n)
        self._hellos()
        active = [s for s in self.slots.values() if s.bye is None]
        if not active:
            return
        names = []
        for s in active:
            names += [self._key(s.slot, "hb"), self._key(s.slot, "steps/n"),
                      self._key(s.slot, "prof/n")]
        values = self.store.multi_get(names)
        now = time.monotonic()
        wanted: list[tuple[Slot, int, str]] = []
        for i, s in enumerate(active):
            hb, nsteps, nprof = (bytes(v) for v in values[3 * i:3 * i + 3])
            for kind, count in ((0, int(nsteps or 0)), (1, int(nprof or 0))):
                stop = min(count, s.read[kind] + MAX_READ)
                what = "steps" if kind == 0 else "prof"
                wanted += [(s, kind, self._key(s.slot, f"{what}/{j}"))
                           for j in range(s.read[kind], stop)]
                s.read[kind] = stop
            if hb != s.raw_hb:
                s.raw_hb, s.seen = hb, now
                beat = self._open(names[3 * i], hb)
                if isinstance(beat, dict):
                    s.heartbeat = beat
                    if isinstance(beat.get("bye"), dict):
                        s.bye = beat["bye"]  # its last batches were counted before it
        self._read_values(wanted)

    def _hellos(self) -> None:
        still = []
        for slot in self.pending[:256]:
            name = self._key(slot, "hello")
            if not self.store.check([name]):
                still.append(slot)
                continue
            hello = self._open(name, self.store.get(name))
            if not isinstance(hello, dict) or not isinstance(hello.get("rank"), int):
                if hello is not None:
                    self._drop("bad hello")
                continue
            self._register(Slot(slot, hello, time.monotonic()))
        self.pending = still + self.pending[256:]

    def _register(self, new: Slot) -> None:
        for old in self.slots.values():
            if old.rank == new.rank and not old.superseded:
                old.superseded = True
                if int(new.hello.get("restart") or 0) > int(old.hello.get("restart") or 0):
                    self.restarts.append({"rank": new.rank, "from": old.hello.get("restart"),
                                          "to": new.hello.get("restart"),
                                          "t": new.hello.get("t"),
                                          "after_step": len(old.steps)})
        self.slots[new.slot] = new

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

    def _read_values(self, wanted: list[tuple[Slot, int, str]]) -> None:
        if not wanted:
            return
        try:
            values = [bytes(v) for v in self.store.multi_get([k for _, _, k in wanted])]
        except Exception:  # noqa: BLE001 - a key that is not there (a forged counter)
            values = [bytes(self.store.get(k)) if self.store.check([k]) else b""
                      for _, _, k in wanted]
        spooled: dict[tuple[int, int], list[bytes]] = {}
        for (s, kind, name), value in zip(wanted, values, strict=True):
            if not value:
                self._drop("missing value")
                continue
            self.store.delete_key(name)
            body, data = self._open_body(name, value)
            if kind == 0 and isinstance(data, list):
                records = [d for d in data if isinstance(d, dict)]
                s.counts[0] += len(records)
                s.steps += records
                del s.steps[:-KEEP_STEPS]
            elif kind == 1 and isinstance(data, dict):
                s.counts[1] += 1
                s.summaries.append({k: data[k] for k in SUMMARY_KEYS if k in data})
                del s.summaries[:-KEEP_SUMMARIES]
            else:
                continue
            spooled.setdefault((s.slot, kind), []).append(body)
        for (slot, kind), bodies in spooled.items():
            path = self.spool_path(slot, kind)
            if path is not None:
                with open(path, "ab") as fh:
                    fh.write(b"".join(b.replace(b"\n", b" ") + b"\n" for b in bodies))

    # -- state ---------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain data for the analysis: the latest incarnation of every rank."""
        now = time.monotonic()
        latest: dict[int, Slot] = {}
        for s in self.slots.values():
            if s.rank not in latest or s.slot > latest[s.rank].slot:
                latest[s.rank] = s
        world = max([int(s.hello.get("world_size") or 0) for s in self.slots.values()]
                    + [max(latest, default=-1) + 1])
        ranks = []
        for r in range(world):
            s = latest.get(r)
            if s is None:
                ranks.append(None)
                continue
            ranks.append({**{k: s.hello.get(k) for k in (
                "rank", "node", "host", "pid", "local_rank", "restart", "device",
                "shared_run_dir", "run_dir", "elastic_run_id", "t")},
                "slot": s.slot, "silent_s": now - s.seen, "bye": s.bye,
                "heartbeat": s.heartbeat, "steps_sent": s.counts[0],
                "summaries_sent": s.counts[1]})
        steps = [latest[r].steps if r in latest else [] for r in range(world)]
        summaries = [latest[r].summaries if r in latest else [] for r in range(world)]
        return {"run_id": self.key.run_id, "world_size": world, "ranks": ranks,
                "steps": steps, "summaries": summaries, "dropped": self.dropped,
                "dropped_why": dict(self.dropped_why), "restarts": list(self.restarts),
                "pending_slots": len(self.pending), "t0": self.t0, "wall_s": time.time() - self.t0,
                "lost_after_s": LOST_S}

    def all_slots(self) -> list[Slot]:
        return sorted(self.slots.values(), key=lambda s: s.slot)
