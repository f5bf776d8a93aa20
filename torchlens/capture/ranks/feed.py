"""The live feed of ``torchlens run``: what ``torchlens.watch`` reads while a job runs.

One frame format, two transports. About once a second (``PUBLISH_S``, from
``frontends.ranks.command.watch``, the collector's own loop) the publisher builds a
frame of what is new since the last one: the run's status (the verdict and one
row per rank, ``analysis.ranks.verdict.live_status``), each rank's new step
records and (cut) summaries, its newest heartbeat when it changed, and the
ranks that ended. It is encoded once and

- appended as one JSON line to ``RUN_DIR/live.jsonl`` (the whole run, for a
  watcher on the run folder; the folder is the user's, and so are its
  permissions), with the status alone in ``RUN_DIR/live.json``, replaced
  atomically (what the JupyterLab sidebar reads to list a job's ranks);
- set, sealed with the run's key, under ``live/<seq>`` in the collector's
  store with the newest seq under ``live/n``, for a watcher on another
  machine (a store client with the run's secret). The store keeps the newest
  ``KEEP_FRAMES``: a late watcher gets the last minute, and the store stays
  bounded however long the run.

Only what is new travels, and all of it: the collector hands the publisher
each step batch and summary head as it keeps them (``Collector.listeners``),
and a frame carries what came since the last one, each record once and in the
order it arrived, whatever it is (a training step, an evaluation or
checkpoint span, a set-up window) and however many came (more than the
``KEEP_STEPS`` the collector keeps in memory). The collector's step count is
no cursor for it: it leaves out labelled spans and takes set-up windows back
once a rank steps. The publisher holds what came since the last frame only
(a second's records), and a frame costs O(ranks) bookkeeping plus them.
``costs`` keeps what publishing took (benchmarks/bench_live_feed.py).

The readers are here too (``FileFeed``, ``StoreFeed``): they hand frames to
``frontends.ranks.watch``. A store frame is opened before it is decoded; one that
fails its seal (forged, or another run's) is dropped and counted
(``protocol.Channel``), never decoded.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import time
from collections import deque
from datetime import timedelta
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import Forged, RunKey
from torchlens.formats.input_files import RefusedFile, open_guarded
from torchlens.formats.run_folder.files import (
    LIVE_FEED,
    LIVE_FORMAT,
    LIVE_STATUS,
    write_live_status,
)
from torchlens.formats.run_folder.manifest import LiveEntry
from torchlens.model.messages import Heartbeat
from torchlens.model.records import StepRecord, records_from

FRAME_FORMAT = "torchlens-live-frame"
VERSION = 1
#: the heartbeat of a slot that has sent none yet
_NO_BEAT = Heartbeat()
PUBLISH_S = 1.0
#: the status (the verdict: ``run_view``) is recomputed for a frame at most
#: every ``STATUS_SHARE`` times what it took last, so that at many ranks it
#: stays a small share of the poll loop; frames in between carry the last one
STATUS_SHARE = 10
#: frames kept in the store (about a minute), and at most this many bytes of them
KEEP_FRAMES = 60
STORE_BUDGET = 64 << 20
#: the largest frame set in the store: TCPStore's server drops a client that
#: sends more than 8 MiB at once (and with it the collector's own connection)
STORE_FRAME_MAX = 4 << 20
#: frames a watcher reads in one store call; bytes of live.jsonl in one read
READ_BATCH = 8
READ_CHUNK = 16 << 20
#: a line of ``live.jsonl`` longer than this is no frame (a 4,096-rank frame is a few
#: MB): skipped unread, counted as bad
MAX_FRAME_BYTES = 256 << 20
#: at the end, how long the collector waits for store watchers to read the last frame
LINGER_S = 3.0


class FrameBeat(msgspec.Struct):
    """A rank's heartbeat in a frame: when (unix s), its RSS, and the step it
    had done (a feed's) or its phase (a finished folder's, made from its step
    records); an unset field is left out of the JSON."""

    t: float | None = None
    rss: int | None = None
    steps_done: int | None | UnsetType = UNSET
    phase: str | UnsetType = UNSET


class LiveFrame(msgspec.Struct):
    """One frame of the live feed (the line ``live.jsonl`` holds), fields in
    the JSON's order: its number and time, the run's start (``t0``) and id,
    the world size, whether the run ended, the status (``analysis.ranks.verdict.
    LiveStatus``'s JSON with the frame's number, run id and time: what
    ``live.json`` holds), and per rank (a string, JSON keys) what is new: step
    records, profiled-step summary heads (the ranks' JSON, typed where the
    watch reads them), ``[why, when]`` for a rank that ended, and heartbeats
    (one per rank from a feed; a list from a finished folder). ``thinned``:
    only in a store frame cut to fit (every k-th step record; 0: none)."""

    format: str = ""
    version: int = 0
    seq: int = 0
    t: float = 0.0
    t0: float | None = None
    run_id: str | None = None
    world_size: int | None = None
    ended: bool = False
    status: dict[str, Any] = {}
    steps: dict[str, list[StepRecord]] = {}
    summaries: dict[str, list[dict[str, Any]]] = {}
    ended_ranks: dict[str, tuple[str, float]] = {}
    heartbeats: dict[str, FrameBeat | list[FrameBeat]] = {}
    thinned: int | UnsetType = UNSET


class FeedGone(RuntimeError):
    """The feed cannot be read any more (the collector closed its store)."""


class FeedReplaced(FeedGone):
    """The run folder's live feed is another file than the one being read (the
    folder was deleted and made again by another run): its frames are not this
    run's, and its offsets not the ones read so far."""


class FeedPublisher:
    """Builds the frames from a ``Collector`` and writes them to both transports."""

    def __init__(self, collector: Any, run_dir: str | None = None) -> None:
        self.collector = collector
        self.key: RunKey = collector.key
        self.run_dir = run_dir
        self.seq = -1
        self.last = -math.inf
        #: slot -> (step records, summaries) the collector kept since the last frame
        self._new: dict[int, tuple[list[Any], list[Any]]] = {}
        self._beats: dict[int, tuple[Any, ...]] = {}  # rank -> the heartbeat published
        self._ended: dict[int, int] = {}  # rank -> the slot whose end was published
        self._file: Any = None
        self._status: dict[str, Any] = {}
        self._status_at = -math.inf
        self._held: deque[tuple[int, int]] = deque()  # frames in the store: (seq, bytes)
        self.errors: dict[str, str] = {}  # transport -> the last error (it goes on without it)
        self.costs: list[float] = []  # seconds per publish, build + both transports
        self.bytes = 0
        self.thinned = 0  # store frames whose step records were thinned to fit
        if run_dir:
            self._file = open(os.path.join(run_dir, LIVE_FEED), "ab")  # noqa: SIM115
        name = protocol.live_announce_key()
        self.collector.store.set(name, self.key.seal(name, protocol.encode(self.key.run_id)))
        # what the collector already holds (its newest) goes in the first frame
        for s in self.collector.all_slots():
            self._took(s, 0, s.steps)
            self._took(s, 1, s.summaries)
        self.collector.listeners.append(self._took)

    def _took(self, s: Any, kind: int, values: list[Any]) -> None:
        """The collector kept ``values`` of ``s`` (kind 0: step records, 1: summaries)."""
        if values:
            self._new.setdefault(s.slot, ([], []))[kind].extend(values)

    def due(self) -> bool:
        return time.monotonic() - self.last >= PUBLISH_S

    def status_due(self, view_s: float) -> bool:
        """A fresh status is worth computing for the next frame (see ``STATUS_SHARE``),
        when the last one took ``view_s`` seconds to compute."""
        return time.monotonic() - self._status_at >= max(PUBLISH_S, STATUS_SHARE * view_s)

    # -- one frame -------------------------------------------------------------
    def frame(self, status: dict[str, Any] | None, ended: bool = False) -> LiveFrame:
        """The next frame: ``status`` (None: the last one again) and what each
        rank sent since the last frame."""
        if status is not None:
            self._status, self._status_at = status, time.monotonic()
        status = self._status
        self.seq += 1
        now = time.time()
        steps: dict[str, list[Any]] = {}
        summaries: dict[str, list[Any]] = {}
        beats: dict[str, FrameBeat | list[FrameBeat]] = {}
        latest: dict[int, Any] = {}
        for start, s in self.collector.numbered_slots():
            new = self._new.pop(s.slot, None)
            # a restart's records say which start they are of (analysis.ranks.starts);
            # the first start's go as kept
            for kind, out in ((0, steps), (1, summaries)):
                records: list[Any] = new[kind] if new is not None else []
                if records:
                    if start:
                        records = [x.replace(restart=start) if kind == 0
                                   else {**x, "restart": start} for x in records]
                    out.setdefault(str(s.rank), []).extend(records)
            if s.rank not in latest or s.slot > latest[s.rank].slot:
                latest[s.rank] = s
        for r, s in latest.items():
            hb = s.heartbeat
            mark = (s.slot, hb.beat, hb.t)
            if hb != _NO_BEAT and self._beats.get(r) != mark:
                self._beats[r] = mark
                beats[str(r)] = FrameBeat(t=hb.t, rss=hb.rss, steps_done=hb.steps_done)
        ended_ranks: dict[str, tuple[str, float]] = {}
        for row in status.get("ranks") or []:
            r, reason = row["rank"], row.get("ended")
            s = latest.get(r)
            if reason is None or s is None or self._ended.get(r) == s.slot:
                continue
            self._ended[r] = s.slot
            t = (s.bye.t if s.bye is not None else None) or s.heartbeat.t or now
            ended_ranks[str(r)] = (reason, t)
        full = {"format": LIVE_FORMAT, "version": VERSION, "seq": self.seq,
                "run_id": self.key.run_id, "t": now, **status, "ended": ended}
        return LiveFrame(format=FRAME_FORMAT, version=VERSION, seq=self.seq, t=now,
                         t0=self.collector.t0, run_id=self.key.run_id,
                         world_size=status.get("world_size"), ended=ended, status=full,
                         steps=steps, summaries=summaries, ended_ranks=ended_ranks,
                         heartbeats=beats)

    def publish(self, status: dict[str, Any] | None, ended: bool = False) -> LiveFrame:
        """Build the next frame and write it to the run folder and the store."""
        started = time.perf_counter()
        self.last = time.monotonic()
        frame = self.frame(status, ended)
        body = protocol.encode(frame)
        self.bytes += len(body)
        if self._file is not None:
            self._guard("file", self._write_files, body, frame)
        self._guard("store", self._set_store, self._fit(frame, body))
        self.costs.append(time.perf_counter() - started)
        return frame

    def _fit(self, frame: LiveFrame, body: bytes) -> bytes:
        """``body``, or a frame with every k-th step record (``thinned``: k) and,
        if that is still too big, none, small enough for the store."""
        if len(body) <= STORE_FRAME_MAX:
            return body
        self.thinned += 1
        # the status and heartbeats stay whole: only the records' share is thinned
        replace = msgspec.structs.replace
        rest = len(protocol.encode(replace(frame, steps={}, thinned=0)))
        room = 0.8 * STORE_FRAME_MAX - rest
        k = math.ceil((len(body) - rest) / room) if room > 0 else 0
        if k <= 0:
            return protocol.encode(replace(frame, steps={}, summaries={}, thinned=0))
        steps = {r: recs[k - 1::k] for r, recs in frame.steps.items()}
        body = protocol.encode(replace(frame, steps=steps, thinned=k))
        if len(body) <= STORE_FRAME_MAX:
            return body
        return protocol.encode(replace(frame, steps={}, summaries={}, thinned=0))

    def _guard(self, transport: str, fn: Any, *args: Any) -> None:
        """A transport that fails (disk full, store gone) must not stop the run."""
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001
            self.errors[transport] = f"{type(exc).__name__}: {exc}"

    def _write_files(self, body: bytes, frame: LiveFrame) -> None:
        self._file.write(body + b"\n")
        self._file.flush()
        write_live_status(self.run_dir, frame.status)

    def _set_store(self, body: bytes) -> None:
        store, run_id = self.collector.store, self.key.run_id
        if store is None:
            return
        name = protocol.live_key(run_id, self.seq)
        store.set(name, self.key.seal(name, body))
        count = protocol.live_count_key(run_id)
        store.set(count, self.key.seal(count, protocol.encode(self.seq)))
        self._held.append((self.seq, len(body)))
        held = sum(size for _, size in self._held)
        while len(self._held) > KEEP_FRAMES or (len(self._held) > 1 and held > STORE_BUDGET):
            seq, size = self._held.popleft()
            held -= size
            store.delete_key(protocol.live_key(run_id, seq))

    # -- the end ---------------------------------------------------------------
    def linger(self, timeout: float = LINGER_S) -> int:
        """Wait (at most ``timeout`` s) until every store watcher read the last
        frame or left; returns how many had not. Counters are unsigned: a forged
        one costs this bounded wait and nothing else."""
        store, run_id = self.collector.store, self.key.run_id
        deadline = time.monotonic() + timeout
        missing = 0
        with contextlib.suppress(Exception):
            while True:
                joined = int(store.add(protocol.live_watchers_key(run_id), 0))
                done = int(store.add(protocol.live_done_key(run_id), 0))
                missing = max(0, joined - done)
                if not missing or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
        return missing

    def close(self) -> None:
        with contextlib.suppress(ValueError):  # nothing more is published
            self.collector.listeners.remove(self._took)
        self._new.clear()
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def manifest_entry(self) -> LiveEntry:
        """What the run folder's manifest says about the feed."""
        costs = sorted(self.costs)
        return LiveEntry(
            feed=LIVE_FEED if self.run_dir else None,
            status=LIVE_STATUS if self.run_dir else None,
            frames=self.seq + 1, bytes=self.bytes, store_thinned=self.thinned,
            publish_ms_median=round(costs[len(costs) // 2] * 1e3, 3) if costs else None,
            publish_ms_max=round(costs[-1] * 1e3, 3) if costs else None,
            errors=dict(self.errors))


# -- readers -------------------------------------------------------------------
def _frame(value: Any) -> LiveFrame | None:
    """A decoded frame, typed (where it enters a watcher); None when it is not
    one. A step record that is not one is left out, not the frame."""
    if not (isinstance(value, dict) and value.get("format") == FRAME_FORMAT):
        return None
    steps = value.get("steps")
    value["steps"] = {r: records_from(recs)[0] for r, recs in steps.items()
                      if isinstance(recs, list)} if isinstance(steps, dict) else {}
    try:
        return msgspec.convert(value, LiveFrame)
    except msgspec.ValidationError:
        return None


def _skip_line(fh: Any) -> int | None:
    """Bytes up to and including the next newline of ``fh`` (read, not kept); None
    when the file ends first."""
    n = 0
    while True:
        more = fh.read(READ_CHUNK)
        if not more:
            return None
        at = more.find(b"\n")
        if at >= 0:
            return n + at + 1
        n += len(more)


class FileFeed:
    """Tails ``RUN_DIR/live.jsonl``: each ``read()`` returns the frames appended since."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, LIVE_FEED)
        self._pos = 0
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file read
        self._run_id: str | None = None  # the run its frames are of
        self.bad = 0  # lines that are not frames
        self.dropped = 0  # nothing is signed here: the folder's permissions guard it

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def read(self) -> list[LiveFrame]:
        """The frames appended since the last read, at most about ``READ_CHUNK``
        bytes of them (a long run's file is caught up with over several reads)."""
        try:
            # the one guarded open: a regular file in the run folder, never a FIFO
            with open_guarded(self.path, within=os.path.dirname(self.path)) as fh:
                st = os.fstat(fh.fileno())
                if self._identity is None:
                    self._identity = (st.st_dev, st.st_ino)
                elif self._identity != (st.st_dev, st.st_ino) or st.st_size < self._pos:
                    raise FeedReplaced(self._replaced())
                fh.seek(self._pos)
                data = fh.read(READ_CHUNK)
                while b"\n" not in data:  # one frame longer than a chunk
                    if len(data) > MAX_FRAME_BYTES:  # no frame is that long: skip it
                        skipped = _skip_line(fh)
                        if skipped is None:
                            return []  # its end is not written yet
                        self._pos += len(data) + skipped
                        self.bad += 1
                        return []
                    more = fh.read(READ_CHUNK)
                    if not more:
                        break
                    data += more
        except (FileNotFoundError, RefusedFile):
            return []
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        self._pos += end
        out = []
        for line in data[:end].splitlines():
            try:
                frame = _frame(json.loads(line))
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                frame = None
            if frame is None:
                self.bad += 1
                continue
            if frame.run_id:  # a new file under a reused inode: its frames say whose
                if self._run_id is not None and frame.run_id != self._run_id:
                    raise FeedReplaced(self._replaced())
                self._run_id = frame.run_id
            out.append(frame)
        return out

    def _replaced(self) -> str:
        return (f"{self.path} is another run's: the run folder was deleted and made again "
                "while it was watched")

    def finished(self) -> None:
        """Nothing to tell the collector: it does not know about file watchers."""

    def close(self) -> None:
        pass


class StoreFeed:
    """A client of the collector's store reading the sealed frames.

    ``connect`` raises ``ConnectionError`` (nothing listening), ``Forged``
    (the secret is not this run's) or ``LookupError`` (no live feed here, or
    another run's), each with what to do, for ``frontends.ranks.watch`` to say.
    """

    def __init__(self, store: Any, key: RunKey) -> None:
        self.store, self.key = store, key
        self.chan = protocol.Channel(store, key)
        self.next = 0
        self._done = False
        store.add(protocol.live_watchers_key(key.run_id), 1)

    @classmethod
    def connect(cls, host: str, port: int, secret: bytes, run_id: str | None = None,
                timeout: float = 10.0) -> StoreFeed:
        try:  # a plain socket first: "nothing listening" at once, not after a timeout
            socket.create_connection((host, port), timeout=min(timeout, 5.0)).close()
        except OSError as exc:
            raise ConnectionError(f"nothing listening at {host}:{port} "
                                  f"({exc.strerror or exc})") from None
        import torch.distributed as dist

        try:
            store = dist.TCPStore(host, port, is_master=False,
                                  timeout=timedelta(seconds=timeout))
        except Exception as exc:  # noqa: BLE001 - torch raises several kinds
            raise ConnectionError(f"{host}:{port} does not answer as a TCPStore: "
                                  f"{str(exc).splitlines()[0] if str(exc) else exc}") from None
        name = protocol.live_announce_key()
        if not store.check([name]):
            raise LookupError(f"{host}:{port} has no torchlens live feed (it is not a "
                              "`torchlens run` collector, or one older than torchlens.watch)")
        data = bytes(store.get(name))
        claimed = _claimed_run_id(data)
        for rid in dict.fromkeys([run_id or claimed, claimed]):
            if rid is None:
                continue
            try:
                RunKey(rid, secret).open(name, data)
            except Forged:
                continue
            if run_id is not None and rid != run_id:
                raise LookupError(f"{host}:{port} hosts run {rid}, not run {run_id}")
            return cls(store, RunKey(rid, secret))
        raise Forged(f"the secret does not open {host}:{port}'s feed (run {claimed}): "
                     "it is another run's secret, or the value there is forged")

    @property
    def dropped(self) -> int:
        return sum(self.chan.dropped.values())

    def read(self) -> list[LiveFrame]:
        """The frames published since the last read (the newest ``KEEP_FRAMES`` at most)."""
        run_id = self.key.run_id
        count = protocol.live_count_key(run_id)
        try:
            if not self.store.check([count]):
                return []
            newest = self.chan.get(count)
            if not isinstance(newest, int) or isinstance(newest, bool) or newest < self.next:
                return []  # forged (counted), or nothing new
            # the oldest kept frame may be deleted while we read: start one later
            first = max(self.next, newest - KEEP_FRAMES + 2, 0)
            names = [protocol.live_key(run_id, i) for i in range(first, newest + 1)]
            if not self.store.check(names):  # the oldest were deleted (the byte budget)
                names = [n for n in names if self.store.check([n])]
            values = []
            for i in range(0, len(names), READ_BATCH):  # frames can be megabytes each
                values += self.store.multi_get(names[i:i + READ_BATCH])
        except Exception as exc:  # noqa: BLE001 - the store went away
            raise FeedGone(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        self.next = newest + 1
        return [f for f in (_frame(self.chan.open(n, v)) for n, v in zip(names, values,
                                                                         strict=True))
                if f is not None]

    def finished(self) -> None:
        """Tell the collector this watcher has what it needs (it may close the store)."""
        if not self._done:
            self._done = True
            with contextlib.suppress(Exception):
                self.store.add(protocol.live_done_key(self.key.run_id), 1)

    def close(self) -> None:
        self.finished()
        self.store = None


def _claimed_run_id(data: bytes) -> str | None:
    """The run id the announcement's body claims (not yet trusted)."""
    from torchlens.capture.channel.signing import MAC_BYTES, MAGIC

    try:
        value = json.loads(data[len(MAGIC) + MAC_BYTES:])
    except ValueError:
        return None
    return value if isinstance(value, str) else None
