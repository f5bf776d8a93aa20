"""The kernel side of %ddp_check: spawn the ranks, watch them, end them.

Why ``subprocess.Popen([python, -m, worker])`` with ``start_new_session=True``
rather than ``multiprocessing``'s spawn context: both fork+exec a fresh
interpreter (no fork of the kernel's threads), but multiprocessing's spawn
re-imports the parent's ``__main__`` in each child (the kernel's, or pytest's)
and cannot put a child in its own process group atomically. A new session per
worker means one ``killpg`` ends the worker and anything it started, and a
SIGINT meant for the kernel never reaches the ranks.

The kernel hosts a ``TCPStore`` on port 0 (a free port, never 29500): it is the
rendezvous of the process group and the side channel for the job, heartbeats,
fingerprints and results. Every value there is signed with a key made for
the run (``signing.RunKey``, handed to the ranks in their environment only)
and read through ``protocol.Channel``, which drops and counts what fails
(docs/SECURITY.md). With --strict it also creates the ranks' shared
fingerprint board (``board``), a small file in /dev/shm. Every exit path
(success, crash, mismatch, hang, KeyboardInterrupt, interpreter exit) goes
through ``_kill_workers`` and ``_release``, which kill each worker's process
group, drop the store so its port is released, and delete the board and the
temp dir.

With ``DdpOptions.elastic`` (``--nnodes``) the ranks start under torch's
elastic agent instead, the kernel's store bound as ``torchlens run``'s
collector binds it; ``elastic`` says how, and the monitor reads each rank's
state from its result instead of an exit code.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from typing import Any

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey
from torchlens.capture.channel.store import host_store
from torchlens.capture.ddp import board, elastic
from torchlens.capture.ranks import torchrun as child

POLL_S = 0.1
CRASH_GRACE_S = 5.0  # after one rank fails, how long the others get to end
STACK_WAIT_S = 0.6
STARTUP_PHASES = ("starting", "init")
AGENT_EXIT_S = 20.0  # --nnodes: how long a finished run's agent gets to end by itself
_RUNNING: weakref.WeakSet[DdpLauncher] = weakref.WeakSet()


@dataclass
class DdpOptions:
    """What the user chose (validated by the front end before anything starts)."""

    world_size: int = 2
    backend: str = "auto"
    timeout_s: float = 30.0
    steps: int = 2
    strict: bool = False
    seed: int = 0
    startup_timeout_s: float = 180.0
    #: --profile: {"every", "budget", "window_s", "max_steps", "run_dir", "keep"}
    profile: dict[str, Any] | None = None
    #: the module a rank runs (``python -m``); a profiled rank's entry also summarises
    entry: str = "torchlens.capture.ddp.worker"
    #: --nnodes: the ranks start under torch's elastic agent (``elastic.ElasticSpec``)
    elastic: Any = None
    #: called with (argv, env additions) of the command every other node runs
    on_other_nodes: Any = None


def resolve_backend(backend: str, world_size: int) -> str:
    """auto: nccl when every rank can have its own GPU, else gloo."""
    if backend != "auto":
        return backend
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


class DdpLauncher:
    """One %ddp_check run: ``run()`` returns the raw records and tables' rows."""

    def __init__(self, job: dict[str, Any], options: DdpOptions,
                 sink: Any | None = None) -> None:
        self.job, self.options, self.sink = job, options, sink
        self.procs: list[subprocess.Popen[bytes]] = []
        self.store: Any = None
        self.port: int | None = None
        self.tmpdir = ""
        self.board_path = ""
        self.heartbeats: list[dict[str, Any]] = []
        self.last_hb: list[dict[str, Any] | None] = [None] * options.world_size
        self.hang: dict[str, Any] | None = None
        self.killed: set[int] = set()
        self.ended_at: list[float | None] = [None] * options.world_size
        self.t0 = 0.0
        n = options.world_size
        self.step_records: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        self.summaries: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        self.dropped_summaries = [0] * n
        self._read = [[0, 0] for _ in range(n)]  # step batches, summaries read per rank
        self.key = RunKey.new()  # a fresh secret per run: an earlier run's ranks fail its MAC
        self.sock: Any = None
        self.results: dict[int, dict[str, Any]] = {}  # --nnodes: the results read so far
        #: --nnodes: ranks of this host gone without a result -> exit code (None: unknown)
        self.gone: dict[int, int | None] = {}
        self._done_seen = 0
        self.other_nodes: tuple[list[str], dict[str, str]] | None = None

    # -- lifecycle ---------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Spawn, monitor, stop; always stops the workers, even on KeyboardInterrupt."""
        import torch.distributed as dist

        from torchlens.capture.channel import pickling

        n = self.options.world_size
        self.t0 = time.time()
        # loopback, or where the user said for several nodes; never every interface
        host = self.options.elastic.host if self.options.elastic is not None else "127.0.0.1"
        self.store, self.sock = host_store(host, 0, 30.0)
        self.port = int(self.store.port)
        tl = protocol.Channel(dist.PrefixStore(protocol.PREFIX, self.store), self.key)
        self.tmpdir = tempfile.mkdtemp(prefix="torchlens-ddp-")
        _RUNNING.add(self)
        outcome, interrupted = "interrupted", False
        try:
            # Heartbeat keys exist from the start so the monitor reads them all
            # with one multi_get (it would block on a missing key).
            # Empty means "none yet", never a value, so it needs no seal.
            tl.store.multi_set([protocol.heartbeat_key(r) for r in range(n)], [b""] * n)
            if self.options.profile:  # counters exist before the first multi_get
                for r in range(n):
                    tl.add(protocol.steps_count_key(r), 0)
                    tl.add(protocol.summary_count_key(r), 0)
                os.makedirs(self.options.profile["run_dir"], exist_ok=True)
            spec = None
            if self.options.strict:
                spec = board.create(n, self.tmpdir)
                self.board_path = spec["file"]
            if self.options.elastic is not None:
                self._start_agent()
            else:
                self._spawn()
            # Workers spend seconds importing torch before they ask for the
            # payload (store.get waits for it): pickle it while they start.
            # Sealed: a worker unpickles only a payload this run's key signed.
            tl.set_bytes(protocol.PAYLOAD, pickling.dumps(dict(self.job, board=spec)))
            # The kernel's own set-up for the run (a live plot: bokeh imports)
            # overlaps the ranks' torch import instead of delaying their start.
            start = getattr(self.sink, "start", None)
            if start is not None:
                start()
            outcome = self._monitor(tl)
            if outcome == "crashed":
                self._tell_unreported()
            if self.sink is not None:  # the last heartbeats, held back by the rate limit
                self.sink.flush(force=True)
        except KeyboardInterrupt:  # the caller shows what was seen, then re-raises
            interrupted = True
        finally:
            self._kill_workers()
            try:
                records = self._collect(tl, outcome)
            finally:
                self._release()
        records["interrupted"] = interrupted
        return records

    def _spawn(self) -> None:
        n = self.options.world_size
        for rank in range(n):
            env = dict(os.environ)
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port), WORLD_SIZE=str(n),
                       RANK=str(rank), LOCAL_RANK=str(rank),
                       TORCHLENS_SYS_PATH=os.pathsep.join(p for p in sys.path if p))
            # The secret goes by environment only: argv is readable by every
            # local user in /proc/*/cmdline, a process's environ only by its owner.
            env.update(self.key.env())
            env.setdefault("OMP_NUM_THREADS", "1")  # N ranks share the cores
            env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d store-wait warnings
            log = open(os.path.join(self.tmpdir, f"log-rank{rank}.txt"), "wb")  # noqa: SIM115
            with log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", self.options.entry, "127.0.0.1",
                     str(self.port), str(rank), str(n), self.tmpdir],
                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, close_fds=True))

    def _start_agent(self) -> None:
        """--nnodes: the local node's elastic agent, and the command for the others."""
        spec = self.options.elastic
        bound = self.sock.getsockname()[0]
        argv = elastic.agent_command(spec, self.key.run_id, self.options.entry,
                                     elastic.store_address(bound), int(self.port), self.tmpdir)
        secret = self.key.write_secret(os.path.join(self.tmpdir, "run.secret"))
        self.other_nodes = elastic.other_nodes(self.key, secret, argv)
        self.procs.append(child.start(argv, elastic.agent_env(self.key),
                                      log=os.path.join(self.tmpdir, "log-agent.txt")))
        print(elastic.hint(spec, bound, *self.other_nodes), file=sys.stderr, flush=True)
        if self.options.on_other_nodes is not None:
            self.options.on_other_nodes(*self.other_nodes)

    def _codes(self, tl: protocol.Channel) -> list[int | None]:
        """Per rank: its exit code; under the agent, from the results that came in."""
        if self.options.elastic is None:
            return [p.poll() for p in self.procs]
        done = int(tl.add(protocol.done_key(), 0))
        if done != self._done_seen:
            self._done_seen = done
            for r in range(self.options.world_size):
                if r not in self.results:
                    self._read_result(tl, r)
        for r in elastic.vanished(self.last_hb, self.results):
            # its result may have come since ``done`` was read: then it is not gone
            if r not in self.gone and not self._read_result(tl, r):
                pid = (self.last_hb[r] or {}).get("pid")
                log = os.path.join(self.tmpdir, "log-agent.txt")
                self.gone[r] = elastic.agent_exit_codes(log).get(pid)
        codes = elastic.rank_codes(self.results, self.options.world_size)
        for r, code in self.gone.items():
            if codes[r] is None:
                codes[r] = 1 if code in (None, 0) else code  # ended, and not well
        return codes

    def _read_result(self, tl: protocol.Channel, rank: int) -> bool:
        """--nnodes: read ``rank``'s result if it is in the store (a forged one is not)."""
        key = protocol.result_key(rank)
        if tl.store.check([key]):
            res = tl.get(key)
            if isinstance(res, dict):
                self.results[rank] = res
                return True
        return False

    def _monitor(self, tl: protocol.Channel) -> str:
        """Poll heartbeats and exit codes until the ranks end, fail or hang.

        The kernel shares the machine's cores with the ranks, so a poll is
        cheap: one ``multi_get`` for every heartbeat, one ``add(done, 0)`` for
        "has any rank finished", a ``waitpid`` per worker, and a decode only of
        heartbeats whose bytes changed.
        """
        opts = self.options
        n = opts.world_size
        hb_keys = [protocol.heartbeat_key(r) for r in range(n)]
        raw: list[bytes] = [b""] * n
        progress: list[Any] = [None] * n
        last_progress = time.monotonic()
        started = time.monotonic()
        failed_at: float | None = None
        while True:
            for rank, value in enumerate(tl.store.multi_get(hb_keys)):
                value = bytes(value)
                if not value or value == raw[rank]:
                    continue
                raw[rank] = value
                hb = tl.open(hb_keys[rank], value)
                if not isinstance(hb, dict):  # forged: counted, and not progress
                    continue
                hb["rank"], hb["t_rel"] = rank, hb["t"] - self.t0
                self.last_hb[rank] = hb
                self.heartbeats.append(hb)
                if self.sink is not None:
                    self.sink.push(hb)
                sig = (hb.get("ops"), hb.get("collectives"), hb.get("phase"),
                       hb.get("modules"), hb.get("steps_done"), hb.get("phase_calls"))
                if sig != progress[rank]:
                    progress[rank], last_progress = sig, time.monotonic()
            if opts.profile:
                self._read_profiling(tl)
            if self.sink is not None:
                self.sink.flush()
            codes = self._codes(tl)
            for rank, code in enumerate(codes):  # the time of a death that sends no report
                if code is not None and self.ended_at[rank] is None:
                    # a rank found gone died after its last heartbeat (0.2 s
                    # apart), before the ranks that then lost their peer
                    hb = self.last_hb[rank] if rank in self.gone else None
                    self.ended_at[rank] = (hb or {}).get("t") or time.time()
                    self._tell_ended(tl, rank, code)
            if all(c is not None for c in codes):
                return "finished" if all(c == 0 for c in codes) else "crashed"
            now = time.monotonic()
            bad = any(c not in (None, 0) for c in codes)
            if opts.elastic is not None and self.procs[0].poll() not in (None, 0):
                bad = True  # the local agent failed: its ranks are gone
            if bad or (tl.add(protocol.done_key(), 0) and tl.check(protocol.stop_key())):
                failed_at = failed_at or now
                if now - failed_at > CRASH_GRACE_S:
                    return "crashed"
            # Importing torch and joining the group can take many seconds on a
            # loaded machine: that is startup, bounded by startup_timeout_s; the
            # hang clock runs once every rank is past it.
            all_up = all(h is not None and h.get("phase") not in STARTUP_PHASES
                         for h in self.last_hb)
            if not all_up and now - started > opts.startup_timeout_s:
                return "startup_timeout"
            if not all_up:
                last_progress = now
            elif now - last_progress > opts.timeout_s and failed_at is None:
                self._dump_stacks(now - last_progress)
                return "hang"
            time.sleep(POLL_S)

    def _tell_ended(self, tl: protocol.Channel, rank: int, code: int) -> None:
        """The live view marks where a rank's lanes end, and why."""
        ended = getattr(self.sink, "rank_ended", None)
        if ended is None:
            return
        if self.options.profile:
            self._read_profiling(tl)  # its last steps first, then the marker
        reason = "finished" if code == 0 else (f"killed by {_signal_name(-code)}" if code < 0
                                               else f"exit code {code}")
        if rank in self.gone and rank not in self.results and self.gone[rank] is None:
            reason = "its process ended without a result (killed by a signal?)"
        if code != 0 and tl.store.check([protocol.result_key(rank)]):
            error = (tl.get(protocol.result_key(rank)) or {}).get("error") or {}
            if error:
                first = str(error.get("message") or "").strip().splitlines()[:1]
                reason = f"{error.get('type', 'error')}: {first[0] if first else ''}"[:200]
        ended(rank, reason, self.ended_at[rank])

    def _tell_unreported(self) -> None:
        """--nnodes, after a crash: mark the ranks whose end nobody saw.

        A rank of another node that was killed, or that its agent stopped when
        a rank failed, sends no result and is not on this host to look at;
        the live view marks it at its last heartbeat. (On one machine every
        rank is the kernel's child: its exit code always says it ended.)
        """
        ended = getattr(self.sink, "rank_ended", None)
        if ended is None or self.options.elastic is None:
            return
        for rank, at in enumerate(self.ended_at):
            if at is None:
                hb = self.last_hb[rank] or {}
                ended(rank, "sent no result (killed, or stopped by its agent after another "
                      "rank failed)", hb.get("t") or time.time())

    def _read_profiling(self, tl: protocol.Channel) -> None:
        """New step batches and summaries of every rank, then delete their keys.

        One ``multi_get`` for the counters, one ``check`` and one
        ``multi_get`` for the new values; deleting what was read keeps the
        store (it lives in this process) flat. A forged value is left where it
        is (counted once) until the rank's own value overwrites it, unless a
        genuine later value of the same rank shows the rank is past it; only
        keys that exist are read, so a forged count cannot block the read.
        """
        n = self.options.world_size
        counts = [int(bytes(v)) for v in tl.store.multi_get(
            [protocol.steps_count_key(r) for r in range(n)]
            + [protocol.summary_count_key(r) for r in range(n)])]
        groups: list[tuple[int, int, list[str]]] = []
        for r in range(n):
            for kind, count in ((0, counts[r]), (1, counts[n + r])):
                name = protocol.steps_key if kind == 0 else protocol.summary_key
                keys = [name(r, i) for i in range(self._read[r][kind], count)]
                if keys:
                    groups.append((r, kind, keys))
        if not groups:
            return
        if not tl.store.check([k for _, _, keys in groups for k in keys]):
            groups = [(r, kind, tl.existing(keys)) for r, kind, keys in groups]
        values = iter(tl.multi_get([k for _, _, keys in groups for k in keys]))
        for rank, kind, keys in groups:
            got = [next(values) for _ in keys]
            last = max((i for i, v in enumerate(got) if v is not None), default=-1)
            for i, (key, data) in enumerate(zip(keys, got, strict=True)):
                if i > last:  # forged, and the rank has not written past it yet
                    break
                tl.delete(key)
                self._read[rank][kind] += 1
                if data is not None:
                    self._take(rank, kind, data)

    def _take(self, rank: int, kind: int, data: Any) -> None:
        """One genuine step batch (``kind`` 0) or summary (1) of ``rank``."""
        if kind == 0 and isinstance(data, list):
            records = [d for d in data if isinstance(d, dict)]
            self.step_records[rank].extend(records)
            push_steps = getattr(self.sink, "push_steps", None)
            if push_steps is not None:
                push_steps(rank, records)
        elif kind == 1 and isinstance(data, dict):
            kept = self.summaries[rank]
            kept.append(data)
            if len(kept) > int((self.options.profile or {}).get("keep", 50)):
                del kept[0]
                self.dropped_summaries[rank] += 1
            push_summary = getattr(self.sink, "push_summary", None)
            if push_summary is not None:
                push_summary(rank, data)

    def _dump_stacks(self, after_s: float) -> None:
        """faulthandler in each live worker writes every thread's Python stack."""
        pids = ([p.pid for p in self.procs] if self.options.elastic is None
                else [h["pid"] for h in elastic.local_ranks(self.last_hb)])  # not the agent
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        time.sleep(STACK_WAIT_S)
        stacks = []
        for rank in range(self.options.world_size):
            path = os.path.join(self.tmpdir, f"stack-rank{rank}.txt")
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    stacks.append(fh.read())
            except OSError:
                stacks.append("")
        self.hang = {"after_s": after_s, "stacks": stacks,
                     "status": [dict(h) if h else None for h in self.last_hb]}

    def _kill_workers(self) -> None:
        """End every worker's process group: TERM, then KILL what is left."""
        if self.options.elastic is not None:
            for p in self.procs:
                if len(set(self.results) | set(self.gone)) == self.options.world_size:
                    # Every rank ended: the agent ends by itself, after meeting
                    # the other agents at their exit barrier (killed before it,
                    # they would wait it out: 300 s) or, when a worker failed,
                    # after logging which workers failed with what exit code
                    # (``elastic.agent_exit_codes``: a killed rank's only trace).
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=AGENT_EXIT_S)
                if p.poll() is None:
                    self.killed.add(p.pid)
                child.end(p, grace_s=5.0)  # the agent ends its workers on SIGTERM
            child.end_leftovers(elastic.local_ranks(self.last_hb), wait_s=1.0)
            return
        for p in self.procs:
            if p.poll() is None:
                self.killed.add(p.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 2.0
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)

    def _release(self) -> None:
        self.store = None  # the TCPStore server stops and frees the port
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
        _RUNNING.discard(self)
        board.remove(self.board_path)
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    # -- records -------------------------------------------------------------
    def _collect(self, tl: protocol.Channel, outcome: str) -> dict[str, Any]:
        n = self.options.world_size
        ranks: list[dict[str, Any] | None] = []
        fingerprints: list[list[dict[str, Any]]] = []
        for rank in range(n):
            res = tl.get(protocol.result_key(rank)) if tl.store.check(
                [protocol.result_key(rank)]) else None
            res = res if isinstance(res, dict) else None  # a forged result: no report
            ranks.append(res)
            count = _published(tl.store, rank, len((res or {}).get("collectives") or []))
            keys = tl.existing([protocol.fingerprint_key(rank, i) for i in range(count)])
            fps = [fp for fp in tl.multi_get(keys) if isinstance(fp, dict)]
            timed = {c["index"]: c for c in (res or {}).get("collectives") or []}
            for fp in fps:
                fp["call_s"] = timed.get(fp["index"], {}).get("call_s")
            fingerprints.append(fps)
            if res is not None:
                res.pop("collectives", None)
                res["log"] = self._log_tail(rank)
        profiling = self._profiling(tl, ranks) if self.options.profile else None
        dropped = dict(tl.dropped)  # the kernel's reads and each rank's reads of its peers
        for res in ranks:
            for kind, count in ((res or {}).get("dropped") or {}).items():
                dropped[kind] = dropped.get(kind, 0) + int(count)
        codes: list[int | None] = [p.returncode for p in self.procs] + [None] * (n - len(self.procs))
        if self.options.elastic is not None:  # per rank, from its result
            codes = elastic.rank_codes({r: res for r, res in enumerate(ranks) if res}, n)
            # gone without one: the agent's log, if it names them (read again: the
            # agent writes it once its node's workers have all stopped)
            logged = elastic.agent_exit_codes(os.path.join(self.tmpdir, "log-agent.txt"))
            for r, code in self.gone.items():
                if codes[r] is None:
                    codes[r] = code if code is not None else logged.get(
                        (self.last_hb[r] or {}).get("pid"))
        errors = [r["error"] for r in ranks if r and r.get("error")]
        if outcome == "crashed" and errors and all(e["type"] == "CollectiveMismatch" for e in errors):
            outcome = "mismatch"
        peaks = []
        for rank in range(n):
            own = [h for h in self.heartbeats if h["rank"] == rank]
            peak = dict((ranks[rank] or {}).get("peak") or {})
            for key in ("rss", "tensor_bytes", "cuda_allocated", "cuda_reserved"):
                vals = [h[key] for h in own if h.get(key) is not None]
                if vals:
                    peak[key] = max(vals + [peak.get(key) or 0])
            peaks.append(peak)
        return {
            "world_size": n, "backend": self.job["backend"], "steps": self.options.steps,
            "strict": self.options.strict, "timeout_s": self.options.timeout_s,
            "seed": self.options.seed, "outcome": outcome, "t0": self.t0,
            "wall_s": time.time() - self.t0, "port": self.port, "board": self.board_path,
            "pids": [p.pid for p in self.procs],
            "ranks": ranks, "fingerprints": fingerprints,
            "exit_codes": (codes if self.options.elastic is not None else
                           [None if p.pid in self.killed else c
                            for p, c in zip(self.procs, codes, strict=False)]),
            "ended_at": list(self.ended_at),
            "killed": sorted(i for i, p in enumerate(self.procs) if p.pid in self.killed),
            "hang": self.hang, "memory_peak": peaks, "heartbeats": self.heartbeats,
            "cells": dict(self.job.get("cells") or {}),
            "profiling": profiling, "dropped": dropped,
            "nodes": _nodes(ranks, self.last_hb, self.options.elastic),
        }

    def _profiling(self, tl: protocol.Channel, ranks: list[dict[str, Any] | None]) -> dict[str, Any]:
        """What --profile measured, and the run folder's manifest and step files."""
        with contextlib.suppress(Exception):  # the store may be gone after a crash
            self._read_profiling(tl)
        opts = self.options.profile or {}
        told = [(r or {}).get("profile") or {} for r in ranks]
        everies = [t["every"] for t in told if t.get("every")]
        run_dir = opts["run_dir"]
        for rank, records in enumerate(self.step_records):
            # windows cut before a late first step() are set-up, not steps
            if any(not r.get("window") for r in records):
                self.step_records[rank] = [r for r in records if not r.get("window")]
        out = {"every": max(everies) if everies else (opts.get("every") or 5),
               "window_s": opts.get("window_s", 1.0), "run_dir": run_dir,
               "max_steps": opts.get("max_steps"), "keep": int(opts.get("keep", 50)),
               "windows": any(t.get("windows") and not t.get("real_steps") for t in told),
               "steps": self.step_records, "summaries": self.summaries,
               "dropped_summaries": self.dropped_summaries}
        with contextlib.suppress(OSError):
            write_run_folder(run_dir, self.job, self.options, ranks, self.step_records)
        return out

    def _log_tail(self, rank: int, limit: int = 4000) -> str:
        path = os.path.join(self.tmpdir, f"log-rank{rank}.txt")
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            return ""
        return data[-limit:].decode("utf-8", "replace")


def write_run_folder(run_dir: str, job: dict[str, Any], options: DdpOptions,
                     ranks: list[dict[str, Any] | None],
                     steps: list[list[dict[str, Any]]]) -> None:
    """``manifest.json`` and each rank's ``steps.jsonl`` (its traces are there already)."""
    from torchlens.formats.run_folder import files, manifest, records

    entries = []
    for rank in range(options.world_size):
        records.write_steps(run_dir, rank, steps[rank])
        res = ranks[rank] or {}
        entries.append(manifest.RankEntry(
            rank=rank, pid=res.get("pid"), host=res.get("hostname"), device=res.get("device"),
            traces=files.rank_traces(run_dir, rank),
            oom_snapshot=files.oom_snapshot(run_dir, rank)))
    manifest.write_manifest(run_dir, manifest.Manifest(
        source=manifest.SOURCE_DDP_CHECK, world_size=options.world_size,
        backend=job.get("backend"), created=time.time(),
        profile={k: v for k, v in (options.profile or {}).items() if k != "run_dir"},
        ranks=entries))


def _nodes(ranks: list[dict[str, Any] | None], last_hb: list[dict[str, Any] | None],
           spec: Any) -> dict[str, Any] | None:
    """--nnodes: the run's nodes and, per rank, its node and host (None: one machine)."""
    if spec is None:
        return None
    where = []
    for res, hb in zip(ranks, last_hb, strict=True):
        src = res if res and res.get("node") is not None else (hb or {})
        where.append({"node": src.get("node"),
                      "host": src.get("hostname") or src.get("host")})
    return {"nnodes": spec.nnodes, "nproc_per_node": spec.nproc_per_node,
            "rdzv_endpoint": spec.rdzv_endpoint, "ranks": where}


def _published(store: Any, rank: int, hint: int) -> int:
    """How many fingerprints ``rank`` published (keys 0..count-1, set in order).

    Existence is monotone in the index, so a doubling then bisecting search
    over ``check`` of one key costs O(log n) round trips instead of two per
    fingerprint; ``hint`` (the rank's own record count) usually makes it 2.
    """
    def has(i: int) -> bool:
        return bool(store.check([protocol.fingerprint_key(rank, i)]))

    lo = hint if hint and has(hint - 1) else 0  # every index < lo exists
    step = 1
    while has(lo + step - 1):  # gallop: then every index < lo + step exists
        lo += step
        step *= 2
    hi = lo + step - 1  # missing
    while lo < hi:
        mid = (lo + hi) // 2
        if has(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def stop_all() -> None:
    """Kill every running check's workers (atexit: the kernel shuts down)."""
    for launcher in list(_RUNNING):
        launcher._kill_workers()
        launcher._release()


atexit.register(stop_all)


def run_check(job: dict[str, Any], options: DdpOptions,
              sink: Any | None = None) -> dict[str, Any]:
    """Run ``job`` on ``options.world_size`` ranks; returns the records dict."""
    return DdpLauncher(job, options, sink).run()


