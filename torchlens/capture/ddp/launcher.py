"""The kernel side of %ddp_check: spawn the ranks, watch them, end them.

How the ranks' processes start and end is ``processes``; what the ranks
publish besides heartbeats is read by ``rank_records``.

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
import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
import weakref
from typing import Any

import msgspec

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey
from torchlens.capture.channel.store import host_store
from torchlens.capture.ddp import board, elastic
from torchlens.capture.ddp.options import EXPORT_PHASE, DdpJob, DdpOptions, ProfileSpec
from torchlens.capture.ddp.processes import (
    end_ranks,
    log_tail,
    read_stacks,
    signal_name,
    spawn_ranks,
    start_agent,
)
from torchlens.capture.ddp.rank_records import StepReader, memory_peaks, read_ranks
from torchlens.formats.run_folder.manifest import RankEntry
from torchlens.model.feed import RankFeed
from torchlens.model.messages import DdpHeartbeat, decode_message
from torchlens.model.payloads import (
    DdpRun,
    HangInfo,
    NodesInfo,
    RankNode,
    RankProfiling,
)
from torchlens.model.rank_report import RankReport, report_from
from torchlens.model.records import StepRecord, without_setup


@dataclasses.dataclass
class CheckRecords:
    """What one %ddp_check run left: the run (``DdpRun``: the ranks' reports,
    collectives, exit codes, memory peaks ...) and every heartbeat read."""

    run: DdpRun
    heartbeats: list[DdpHeartbeat]


@dataclasses.dataclass
class HangReport:
    """Why the hang detector stopped the run: how long no rank made progress,
    each rank's Python stack and its last heartbeat (None: it sent none)."""

    after_s: float
    stacks: list[str]
    status: list[DdpHeartbeat | None]

    def info(self) -> HangInfo:
        """As ``DdpRun.hang`` keeps it (each heartbeat as the rank sent it, with the
        launcher's ``rank`` and ``t_rel``)."""
        return HangInfo(after_s=self.after_s, stacks=self.stacks,
                        status=[h.row(last=True) if h else None for h in self.status])


POLL_S = 0.1
CRASH_GRACE_S = 5.0  # after one rank fails, how long the others get to end
STARTUP_PHASES = ("starting", "init")
_RUNNING: weakref.WeakSet[DdpLauncher] = weakref.WeakSet()


class DdpLauncher:
    """One %ddp_check run: ``run()`` returns the raw records and tables' rows."""

    def __init__(self, job: DdpJob, options: DdpOptions,
                 sink: RankFeed | None = None) -> None:
        self.job, self.options, self.sink = job, options, sink
        self.procs: list[subprocess.Popen[bytes]] = []
        self.store: Any = None
        self.port: int | None = None
        self.tmpdir = ""
        self.board_path = ""
        self.heartbeats: list[DdpHeartbeat] = []
        self.last_hb: list[DdpHeartbeat | None] = [None] * options.world_size
        self.hang: HangReport | None = None
        self.killed: set[int] = set()
        self.ended_at: list[float | None] = [None] * options.world_size
        self.t0 = 0.0
        self.reader = StepReader(options.world_size,
                                 options.profile.keep if options.profile else 50, sink,
                                 run_dir=options.profile.run_dir if options.profile else None)
        # the reader's lists themselves: what it reads lands in the records
        self.step_records = self.reader.step_records
        self.summaries = self.reader.summaries
        self.dropped_summaries = self.reader.dropped_summaries
        self.key = RunKey.new()  # a fresh secret per run: an earlier run's ranks fail its MAC
        self.sock: Any = None
        self.results: dict[int, RankReport] = {}  # --nnodes: the results read so far
        #: --nnodes: ranks of this host gone without a result -> exit code (None: unknown)
        self.gone: dict[int, int | None] = {}
        self._done_seen = 0
        self.other_nodes: tuple[list[str], dict[str, str]] | None = None

    # -- lifecycle ---------------------------------------------------------
    def run(self) -> CheckRecords:
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
                os.makedirs(self.options.profile.run_dir, exist_ok=True)
            spec = None
            if self.options.strict:
                spec = board.create(n, self.tmpdir)
                self.board_path = spec.file
            if self.options.elastic is not None:
                self.other_nodes = start_agent(
                    self.procs, self.options.elastic, self.key, self.options.entry, self.sock,
                    self.port, self.tmpdir, self.options.on_other_nodes)
            else:
                spawn_ranks(self.procs, self.options.entry, self.port, n, self.key, self.tmpdir)
            # Workers spend seconds importing torch before they ask for the
            # payload (store.get waits for it): pickle it while they start.
            # Sealed: a worker unpickles only a payload this run's key signed.
            tl.set_bytes(protocol.PAYLOAD, pickling.dumps(dataclasses.replace(self.job, board=spec)))
            # The kernel's own set-up for the run (a live plot: bokeh imports)
            # overlaps the ranks' torch import instead of delaying their start.
            if self.sink is not None:
                self.sink.start()
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
        records.run.interrupted = interrupted
        return records

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
                pid = (self.last_hb[r] or DdpHeartbeat()).pid
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
            res = report_from(tl.get(key))
            if res is not None:
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
        export_since: float | None = None
        while True:
            for rank, value in enumerate(tl.store.multi_get(hb_keys)):
                value = bytes(value)
                if not value or value == raw[rank]:
                    continue
                raw[rank] = value
                hb = decode_message(tl.open(hb_keys[rank], value), DdpHeartbeat)
                if hb is None or hb.t is None:  # forged: counted, and not progress
                    continue
                hb.rank, hb.t_rel = rank, hb.t - self.t0
                self.last_hb[rank] = hb
                self.heartbeats.append(hb)
                if self.sink is not None:
                    self.sink.push(hb)
                sig = (hb.ops, hb.collectives, hb.phase, hb.modules, hb.steps_done,
                       hb.phase_calls)
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
                    self.ended_at[rank] = (hb.t if hb else None) or time.time()
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
            all_up = all(h is not None and h.phase not in STARTUP_PHASES
                         for h in self.last_hb)
            if not all_up and now - started > opts.startup_timeout_s:
                return "startup_timeout"
            exporting = any(h is not None and h.phase == EXPORT_PHASE for h in self.last_hb)
            if not exporting:
                export_since = None
            elif export_since is None:
                export_since = now
            if not all_up or (exporting and now - export_since <= opts.startup_timeout_s):
                last_progress = now  # starting, or busy in torchlens' own export
            elif now - last_progress > opts.timeout_s and failed_at is None:
                self._dump_stacks(now - last_progress)
                return "hang"
            time.sleep(POLL_S)

    def _tell_ended(self, tl: protocol.Channel, rank: int, code: int) -> None:
        """The live view marks where a rank's lanes end, and why."""
        if self.sink is None:
            return
        if self.options.profile:
            self._read_profiling(tl)  # its last steps first, then the marker
        reason = "finished" if code == 0 else (f"killed by {signal_name(-code)}" if code < 0
                                               else f"exit code {code}")
        if rank in self.gone and rank not in self.results and self.gone[rank] is None:
            reason = "its process ended without a result (killed by a signal?)"
        if code != 0 and tl.store.check([protocol.result_key(rank)]):
            res = report_from(tl.get(protocol.result_key(rank)))
            if res is not None and res.error is not None:
                reason = f"{res.error.type}: {res.error.first_line()}"[:200]
        self.sink.rank_ended(rank, reason, self.ended_at[rank])

    def _tell_unreported(self) -> None:
        """--nnodes, after a crash: mark the ranks whose end nobody saw.

        A rank of another node that was killed, or that its agent stopped when
        a rank failed, sends no result and is not on this host to look at;
        the live view marks it at its last heartbeat. (On one machine every
        rank is the kernel's child: its exit code always says it ended.)
        """
        if self.sink is None or self.options.elastic is None:
            return
        for rank, at in enumerate(self.ended_at):
            if at is None:
                hb = self.last_hb[rank]
                self.sink.rank_ended(rank, "sent no result (killed, or stopped by its agent after another "
                      "rank failed)", (hb.t if hb else None) or time.time())

    def _read_profiling(self, tl: protocol.Channel) -> None:
        """The ranks' new step batches and summaries, into the records and the sink."""
        self.reader.read(tl)

    def _dump_stacks(self, after_s: float) -> None:
        """faulthandler in each live worker writes every thread's Python stack."""
        pids = ([p.pid for p in self.procs] if self.options.elastic is None
                else [h.pid for h in elastic.local_ranks(self.last_hb)])  # not the agent
        self.hang = HangReport(after_s=after_s,
                               stacks=read_stacks(pids, self.options.world_size, self.tmpdir),
                               status=list(self.last_hb))

    def _kill_workers(self) -> None:
        """End every worker's process group: TERM, then KILL what is left."""
        ended = len(set(self.results) | set(self.gone)) == self.options.world_size
        end_ranks(self.procs, self.killed, self.options.elastic is not None, ended, self.last_hb)

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
    def _collect(self, tl: protocol.Channel, outcome: str) -> CheckRecords:
        n = self.options.world_size
        ranks, fingerprints = read_ranks(tl, n)
        for rank, res in enumerate(ranks):
            if res is not None:
                res.log = log_tail(self.tmpdir, rank)
        profiling = self._profiling(tl, ranks) if self.options.profile else None
        dropped = dict(tl.dropped)  # the kernel's reads and each rank's reads of its peers
        for res in ranks:
            for kind, count in (res.dropped if res is not None else {}).items():
                dropped[kind] = dropped.get(kind, 0) + count
        codes: list[int | None] = [p.returncode for p in self.procs] + [None] * (n - len(self.procs))
        if self.options.elastic is not None:  # per rank, from its result
            codes = elastic.rank_codes({r: res for r, res in enumerate(ranks) if res}, n)
            # gone without one: the agent's log, if it names them (read again: the
            # agent writes it once its node's workers have all stopped)
            logged = elastic.agent_exit_codes(os.path.join(self.tmpdir, "log-agent.txt"))
            for r, code in self.gone.items():
                if codes[r] is None:
                    codes[r] = code if code is not None else logged.get(
                        (self.last_hb[r] or DdpHeartbeat()).pid)
        errors = [r.error for r in ranks if r is not None and r.error is not None]
        if outcome == "crashed" and errors and all(e.type == "CollectiveMismatch" for e in errors):
            outcome = "mismatch"
        nodes = _nodes(ranks, self.last_hb, self.options.elastic)
        run = DdpRun(
            world_size=n, backend=self.job.backend, steps=self.options.steps,
            strict=self.options.strict, timeout_s=self.options.timeout_s,
            seed=self.options.seed, outcome=outcome, t0=self.t0,
            wall_s=time.time() - self.t0, port=self.port, board=self.board_path,
            pids=[p.pid for p in self.procs],
            ranks=ranks, fingerprints=fingerprints,
            exit_codes=(codes if self.options.elastic is not None else
                        [None if p.pid in self.killed else c
                         for p, c in zip(self.procs, codes, strict=False)]),
            ended_at=list(self.ended_at),
            killed=sorted(i for i, p in enumerate(self.procs) if p.pid in self.killed),
            hang=self.hang.info() if self.hang else None,
            memory_peak=list(memory_peaks(ranks, self.heartbeats)),
            cells=dict(self.job.cells), profiling=profiling, dropped=dropped,
            nodes=nodes)
        return CheckRecords(run, self.heartbeats)

    def _profiling(self, tl: protocol.Channel,
                   ranks: list[RankReport | None]) -> RankProfiling:
        """What --profile measured, and the run folder's manifest and step files."""
        with contextlib.suppress(Exception):  # the store may be gone after a crash
            self._read_profiling(tl)
        opts = self.options.profile or ProfileSpec()
        told = [r.profile for r in ranks if r is not None and r.profile is not None]
        everies = [t.every for t in told if t.every]
        run_dir = opts.run_dir
        # windows cut before a late first step() are set-up, not steps
        self.step_records = [list(without_setup(records)) for records in self.step_records]
        out = RankProfiling(
            every=max(everies) if everies else (opts.every or 5),
            window_s=opts.window_s, run_dir=run_dir, max_steps=opts.max_steps, keep=opts.keep,
            windows=any(t.windows and not t.real_steps for t in told),
            # how the steps were found: rank 0's words (every rank runs the same function)
            steps_by=next((t.steps_by for t in told if t.steps_by), ""),
            steps=self.step_records, summaries=self.summaries,
            dropped_summaries=self.dropped_summaries)
        with contextlib.suppress(OSError):
            write_run_folder(run_dir, self.job, self.options, ranks, self.step_records,
                             started=self.t0)
        return out


def _ended(entry: RankEntry, res: RankReport | None, steps: int) -> RankEntry:
    """``entry`` with how its %ddp_check rank ended, in the manifest's words (as
    ``torchlens run`` writes them): a rank that raised is ``failed`` with its
    exception, so the folder's report says the crash, not only the steps before it."""
    if res is None:
        return entry
    err = res.error
    if err is None:
        return msgspec.structs.replace(entry, state="finished", steps=steps)
    return msgspec.structs.replace(
        entry, state="failed", error=f"{err.type or 'error'}: {err.first_line()}"[:300],
        stopped_at_step=steps, steps=steps)


def write_run_folder(run_dir: str, job: DdpJob, options: DdpOptions,
                     ranks: list[RankReport | None],
                     steps: list[list[StepRecord]], started: float | None = None) -> None:
    """``manifest.json`` and each rank's ``steps.jsonl`` (its traces are there already);
    ``started``: the launch (unix s), the origin of the run's times in its view."""
    from torchlens.formats.run_folder import manifest, write

    def rank_files(rank: int) -> write.RankFiles:
        res = ranks[rank]
        # one machine unless --nnodes: node 0, as torchlens run labels it (a watch of
        # the finished folder then labels its series node="0", not node="")
        node = res.node if res is not None and res.node is not None else (
            None if options.elastic else 0)
        entry = _ended(manifest.RankEntry(
            rank=rank, pid=res.pid if res else None, host=res.hostname if res else None,
            device=res.device if res else None, node=node), res, len(steps[rank]))
        return write.RankFiles(entry, steps[rank], oom=res.oom_snapshot if res else None)

    write.write_run_folder(run_dir, manifest.Manifest(
        source=manifest.SOURCE_DDP_CHECK, world_size=options.world_size,
        backend=job.backend, created=time.time(), started=started,
        profile=options.profile.manifest() if options.profile else manifest.ProfileEntry()),
        (rank_files(rank) for rank in range(options.world_size)))


def _nodes(ranks: list[RankReport | None], last_hb: list[DdpHeartbeat | None],
           spec: Any) -> NodesInfo | None:
    """--nnodes: the run's nodes and, per rank, its node and host (None: one machine)."""
    if spec is None:
        return None
    where = []
    for res, hb in zip(ranks, last_hb, strict=True):
        if res is not None and res.node is not None:
            where.append(RankNode(node=res.node, host=res.hostname))
        else:
            where.append(RankNode(node=hb.node if hb else None, host=hb.host if hb else None))
    return NodesInfo(nnodes=spec.nnodes, nproc_per_node=spec.nproc_per_node,
                     rdzv_endpoint=spec.rdzv_endpoint, ranks=where)


def stop_all() -> None:
    """Kill every running check's workers (atexit: the kernel shuts down)."""
    for launcher in list(_RUNNING):
        launcher._kill_workers()
        launcher._release()


atexit.register(stop_all)


def run_check(job: DdpJob, options: DdpOptions,
              sink: RankFeed | None = None) -> CheckRecords:
    """Run ``job`` on ``options.world_size`` ranks; returns what it left."""
    return DdpLauncher(job, options, sink).run()


