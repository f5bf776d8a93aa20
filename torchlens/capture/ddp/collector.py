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

Clocks: a rank's heartbeat age is measured on the collector's clock (when
its bytes last changed), so hosts with skewed clocks are judged alike.
"""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from . import protocol
from .signing import Forged, RunKey

#: a slot whose heartbeat has not changed for this long stopped sending
LOST_S = 10.0
#: new values read per slot and kind in one poll (bounds a forged counter)
MAX_READ = 64
#: how long a read of a key that is not there blocks (only forged counters do)
STORE_TIMEOUT_S = 2.0
#: summaries kept per rank (the step records are all kept: ~300 bytes a step)
KEEP_SUMMARIES = 50


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

    @property
    def rank(self) -> int:
        return int(self.hello["rank"])


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host`` (an address, or an interface name) and ``port``."""
    address = interface_address(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((address, port))
    sock.listen(1024)
    return sock


def interface_address(host: str) -> str:
    """An interface name (``eth0``) -> its first IPv4 address; anything else as is."""
    import psutil

    for addr in psutil.net_if_addrs().get(host, []):
        if addr.family == socket.AF_INET:
            return addr.address
    return host


class Collector:
    """Hosts the store and keeps what each slot sent."""

    def __init__(self, key: RunKey, host: str = "127.0.0.1", port: int = 0) -> None:
        import torch.distributed as dist

        self.key = key
        self.sock = listen_socket(host, port)
        self.host = self.sock.getsockname()[0]
        self.port = int(self.sock.getsockname()[1])
        self.store = dist.TCPStore(self.host, self.port, None, True,
                                   timedelta(seconds=STORE_TIMEOUT_S),
                                   wait_for_workers=False, master_listen_fd=self.sock.fileno())
        self.slots: dict[int, Slot] = {}
        self.pending: list[int] = []  # slots taken whose hello has not come
        self.known = 0
        self.dropped = 0
        self.dropped_why: dict[str, int] = {}
        self.restarts: list[dict[str, Any]] = []
        self.t0 = time.time()

    def close(self) -> None:
        self.store = None  # the server stops with its last reference
        with contextlib.suppress(OSError):
            self.sock.close()

    def _drop(self, why: str) -> None:
        self.dropped += 1
        self.dropped_why[why] = self.dropped_why.get(why, 0) + 1

    def _open(self, name: str, value: Any) -> Any:
        """The decoded JSON of a sealed value; None (counted) when it is not ours."""
        try:
            return protocol.decode(self.key.open(name, bytes(value)))
        except Forged:
            self._drop("bad signature")
        except ValueError:
            self._drop("not JSON")
        return None

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

    def _read_values(self, wanted: list[tuple[Slot, int, str]]) -> None:
        if not wanted:
            return
        try:
            values = [bytes(v) for v in self.store.multi_get([k for _, _, k in wanted])]
        except Exception:  # noqa: BLE001 - a key that is not there (a forged counter)
            values = [bytes(self.store.get(k)) if self.store.check([k]) else b""
                      for _, _, k in wanted]
        for (s, kind, name), value in zip(wanted, values, strict=True):
            if not value:
                self._drop("missing value")
                continue
            self.store.delete_key(name)
            data = self._open(name, value)
            if kind == 0 and isinstance(data, list):
                s.steps += [d for d in data if isinstance(d, dict)]
            elif kind == 1 and isinstance(data, dict):
                s.summaries.append(data)
                del s.summaries[:-KEEP_SUMMARIES]

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
                "heartbeat": s.heartbeat, "steps_sent": len(s.steps)})
        steps = [latest[r].steps if r in latest else [] for r in range(world)]
        summaries = [latest[r].summaries if r in latest else [] for r in range(world)]
        return {"run_id": self.key.run_id, "world_size": world, "ranks": ranks,
                "steps": steps, "summaries": summaries, "dropped": self.dropped,
                "dropped_why": dict(self.dropped_why), "restarts": list(self.restarts),
                "pending_slots": len(self.pending), "t0": self.t0, "wall_s": time.time() - self.t0,
                "lost_after_s": LOST_S}

    def all_slots(self) -> list[Slot]:
        return sorted(self.slots.values(), key=lambda s: s.slot)
