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
fingerprints and results. With --strict it also creates the ranks' shared
fingerprint board (``board``), a small file in /dev/shm. Every exit path
(success, crash, mismatch, hang, KeyboardInterrupt, interpreter exit) goes
through ``_kill_workers`` and ``_release``, which kill each worker's process
group, drop the store so its port is released, and delete the board and the
temp dir.
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
from datetime import timedelta
from typing import Any

from . import board, protocol

POLL_S = 0.1
CRASH_GRACE_S = 5.0  # after one rank fails, how long the others get to end
STACK_WAIT_S = 0.6
STARTUP_PHASES = ("starting", "init")
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

    # -- lifecycle ---------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Spawn, monitor, stop; always stops the workers, even on KeyboardInterrupt."""
        import cloudpickle
        import torch.distributed as dist

        n = self.options.world_size
        self.t0 = time.time()
        self.store = dist.TCPStore("127.0.0.1", 0, n, is_master=True,
                                   wait_for_workers=False, timeout=timedelta(seconds=30))
        self.port = int(self.store.port)
        tl = dist.PrefixStore(protocol.PREFIX, self.store)
        self.tmpdir = tempfile.mkdtemp(prefix="torchlens-ddp-")
        _RUNNING.add(self)
        outcome, interrupted = "interrupted", False
        try:
            # Heartbeat keys exist from the start so the monitor reads them all
            # with one multi_get (it would block on a missing key).
            tl.multi_set([protocol.heartbeat_key(r) for r in range(n)], [b""] * n)
            spec = None
            if self.options.strict:
                spec = board.create(n, self.tmpdir)
                self.board_path = spec["file"]
            self._spawn()
            # Workers spend seconds importing torch before they ask for the
            # payload (store.get waits for it): pickle it while they start.
            tl.set(protocol.PAYLOAD, cloudpickle.dumps(dict(self.job, board=spec)))
            # The kernel's own set-up for the run (a live plot: bokeh imports)
            # overlaps the ranks' torch import instead of delaying their start.
            start = getattr(self.sink, "start", None)
            if start is not None:
                start()
            outcome = self._monitor(tl)
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
            env.setdefault("OMP_NUM_THREADS", "1")  # N ranks share the cores
            env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d store-wait warnings
            log = open(os.path.join(self.tmpdir, f"log-rank{rank}.txt"), "wb")  # noqa: SIM115
            with log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "torchlens.capture.ddp.worker", "127.0.0.1",
                     str(self.port), str(rank), str(n), self.tmpdir],
                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, close_fds=True))

    def _monitor(self, tl: Any) -> str:
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
            for rank, value in enumerate(tl.multi_get(hb_keys)):
                value = bytes(value)
                if not value or value == raw[rank]:
                    continue
                raw[rank] = value
                hb = protocol.decode(value)
                hb["rank"], hb["t_rel"] = rank, hb["t"] - self.t0
                self.last_hb[rank] = hb
                self.heartbeats.append(hb)
                if self.sink is not None:
                    self.sink.push(hb)
                sig = (hb.get("ops"), hb.get("collectives"), hb.get("phase"),
                       hb.get("modules"))
                if sig != progress[rank]:
                    progress[rank], last_progress = sig, time.monotonic()
            if self.sink is not None:
                self.sink.flush()
            codes = [p.poll() for p in self.procs]
            for rank, code in enumerate(codes):  # the time of a death that sends no report
                if code is not None and self.ended_at[rank] is None:
                    self.ended_at[rank] = time.time()
            if all(c is not None for c in codes):
                return "finished" if all(c == 0 for c in codes) else "crashed"
            now = time.monotonic()
            bad = any(c not in (None, 0) for c in codes)
            if bad or (tl.add(protocol.done_key(), 0) and tl.check([protocol.stop_key()])):
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

    def _dump_stacks(self, after_s: float) -> None:
        """faulthandler in each live worker writes every thread's Python stack."""
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGUSR1)
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
        _RUNNING.discard(self)
        board.remove(self.board_path)
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    # -- records -------------------------------------------------------------
    def _collect(self, tl: Any, outcome: str) -> dict[str, Any]:
        n = self.options.world_size
        ranks: list[dict[str, Any] | None] = []
        fingerprints: list[list[dict[str, Any]]] = []
        for rank in range(n):
            res = protocol.decode(tl.get(protocol.result_key(rank))) if tl.check(
                [protocol.result_key(rank)]) else None
            ranks.append(res)
            count = _published(tl, rank, len((res or {}).get("collectives") or []))
            keys = [protocol.fingerprint_key(rank, i) for i in range(count)]
            fps = [protocol.decode(bytes(v)) for v in tl.multi_get(keys)] if keys else []
            timed = {c["index"]: c for c in (res or {}).get("collectives") or []}
            for fp in fps:
                fp["call_s"] = timed.get(fp["index"], {}).get("call_s")
            fingerprints.append(fps)
            if res is not None:
                res.pop("collectives", None)
                res["log"] = self._log_tail(rank)
        codes = [p.returncode for p in self.procs] + [None] * (n - len(self.procs))
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
            "exit_codes": [None if p.pid in self.killed else c
                           for p, c in zip(self.procs, codes, strict=False)],
            "ended_at": list(self.ended_at),
            "killed": sorted(i for i, p in enumerate(self.procs) if p.pid in self.killed),
            "hang": self.hang, "memory_peak": peaks, "heartbeats": self.heartbeats,
            "cells": dict(self.job.get("cells") or {}),
        }

    def _log_tail(self, rank: int, limit: int = 4000) -> str:
        path = os.path.join(self.tmpdir, f"log-rank{rank}.txt")
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            return ""
        return data[-limit:].decode("utf-8", "replace")


def _published(tl: Any, rank: int, hint: int) -> int:
    """How many fingerprints ``rank`` published (keys 0..count-1, set in order).

    Existence is monotone in the index, so a doubling then bisecting search
    over ``check`` of one key costs O(log n) round trips instead of two per
    fingerprint; ``hint`` (the rank's own record count) usually makes it 2.
    """
    def has(i: int) -> bool:
        return bool(tl.check([protocol.fingerprint_key(rank, i)]))

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


