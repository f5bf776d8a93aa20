"""``torchlens run [--out RUN_DIR] [--host IFACE] [--port P] -- torchrun ... train.py ARGS``.

Hosts the collector (``capture.ranks.collector``), starts the command with the
environment its ranks attach with (``capture.ranks.attach``), draws the live
summary (``analysis.ranks.verdict`` -> ``render.ranks.terminal``) until the
command ends, then writes the run folder and returns the command's exit
code. Ctrl-C (or SIGTERM) ends the command's process group and still writes
the folder. A reader that goes away (``torchlens run ... | head``) ends
nothing: the summary goes to /dev/null from then on and the run goes on to
its end (``_Output``). docs/MULTINODE.md says what a user sees.

The secret goes to the local command through its environment only. Other
nodes get it through a 0600 file in the run folder (``run.secret``), named by
the printed ``TORCHLENS_RUN_SECRET_FILE=`` line; the file is deleted when the
run ends (the secret is of no use after it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

import msgspec

from torchlens.formats.run_folder import files
from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    CreepEntry,
    LiveEntry,
    LostNodeEntry,
    Manifest,
    NodeEntry,
    RankEntry,
    RestartEntry,
)
from torchlens.formats.run_folder.write import RankFiles, write_run_folder
from torchlens.frontends.ranks import autoattach
from torchlens.frontends.ranks import registry as run_registry
from torchlens.model import InputError
from torchlens.model.messages import Bye, Heartbeat, Hello
from torchlens.model.records import StepRecord, decode_batch

if TYPE_CHECKING:
    from torchlens.analysis.ranks.verdict import RankRow

POLL_S = 0.25
#: after the command ends: polls for the last batches its ranks wrote
FINAL_POLLS = 3
TAIL_LINES = 20
#: what a shell reports for Ctrl-C (128 + SIGINT); also after SIGTERM (docs/MULTINODE.md)
EXIT_INTERRUPTED = 130
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: torch 2.13's c10d rendezvous lends its store to the workers; after an
#: elastic restart the new gloo workers read their predecessors' stale
#: addresses there and fail or hang (3 restarts in 4 on our machine, bare
#: torchrun). "1": each rendezvous round builds a fresh store. A value the user
#: set wins; every node must agree, so the other nodes' command carries the value.
FRESH_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
#: the other nodes' ranks attach at start too: the directory of their own
#: torchlens install first on PYTHONPATH (``autoattach``'s ``__main__`` prints it)
OTHER_PYTHONPATH = ('PYTHONPATH="$(python -mtorchlens.frontends.ranks.autoattach)'
                    '${PYTHONPATH:+:$PYTHONPATH}"')


def _reachable_address(bound: str) -> str:
    """What other processes should dial: the bound address, or this host for a wildcard."""
    if bound in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return bound


def _check_command(command: list[str]) -> list[str]:
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InputError("no command to run: torchlens run [--out DIR] -- torchrun ... train.py")
    if shutil.which(command[0]) is None:
        raise InputError(f"{command[0]}: command not found")
    return command


def _out_dir(out: str | None) -> str:
    out = out or time.strftime("torchlens-run-%Y%m%d-%H%M%S")
    if os.path.exists(os.path.join(out, files.MANIFEST)):
        raise InputError(f"{out} already holds a run ({files.MANIFEST}): choose another --out")
    os.makedirs(out, exist_ok=True)
    return os.path.abspath(out)


def nodes(command: list[str]) -> int:
    """How many nodes ``command`` asks torchrun for: ``--nnodes N`` or the
    elastic ``--nnodes MIN:MAX`` (MAX), before the training script; 1 without,
    2 for a value it cannot read (then the other nodes' command is shown)."""
    for i, word in enumerate(command):
        if word.endswith(".py"):
            break
        value = None
        if word == "--nnodes" and i + 1 < len(command):
            value = command[i + 1]
        elif word.startswith("--nnodes="):
            value = word.split("=", 1)[1]
        if value is not None:
            top = value.rsplit(":", 1)[-1]
            return int(top) if top.isdigit() else 2
    return 1


def _exit_code(code: int | None) -> int:
    if code is None:
        return 1
    return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says


def run(command: list[str], out: str | None = None, host: str = "127.0.0.1", port: int = 0,
        stream: TextIO | None = None, tty: bool | None = None, metrics: str | None = None,
        metrics_token_file: str | None = None) -> int:
    """Run ``command`` under the collector; returns its exit code. ``metrics``:
    ``[HOST:]PORT`` to serve Prometheus series at (``metrics_endpoint``);
    ``metrics_token_file``: the user's bearer token for it (else one per run)."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d's store-wait warnings
    command = _check_command(list(command))
    from torchlens.frontends.ranks import launchers, metrics_endpoint
    metrics_at = metrics_endpoint.parse_address(metrics) if metrics else None
    if metrics_token_file is not None:  # checked before the job starts
        if metrics_at is None:
            raise InputError("--metrics-token-file is for --metrics: add --metrics [HOST:]PORT")
        metrics_endpoint.read_token(metrics_token_file)
    run_dir = _out_dir(out)
    from torchlens.analysis.ranks.job_exit import job_ended
    from torchlens.analysis.ranks.verdict import live_status, run_view
    from torchlens.capture.channel.signing import ENV_RUN_ID, ENV_SECRET_FILE, RunKey
    from torchlens.capture.ranks import torchrun as child
    from torchlens.capture.ranks.attach import ENV_COLLECTOR, ENV_RUN_DIR
    from torchlens.capture.ranks.collector import Collector
    from torchlens.capture.ranks.feed import FeedPublisher
    from torchlens.render.ranks.terminal import TerminalSummary

    stream = _Output(stream or sys.stdout)
    key = RunKey.new()
    try:
        collector = Collector(key, host, port, spool=os.path.join(run_dir, files.SPOOL_DIR))
    except OSError as exc:
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    address = f"{_reachable_address(collector.host)}:{collector.port}"
    feed = FeedPublisher(collector, run_dir)  # what torchlens.watch reads (docs/MULTINODE.md)
    secret_path = key.write_secret(os.path.join(run_dir, files.SECRET_FILE))
    env = {ENV_COLLECTOR: address, **key.env(), ENV_RUN_DIR: run_dir,
           FRESH_STORE: os.environ.get(FRESH_STORE, "1"), **autoattach.pythonpath(os.environ)}
    summary = TerminalSummary(stream, tty)
    loopback = collector.host in LOOPBACK
    summary.say(f"torchlens run: run {key.run_id}, collector {address}, run folder {run_dir}")
    if (unattached := launchers.accelerate_cpu(command)) is not None:
        summary.say(f"torchlens run: {unattached}")
    other = (f"{ENV_COLLECTOR}={address} {ENV_RUN_ID}={key.run_id} "
             f"{ENV_SECRET_FILE}={secret_path} {ENV_RUN_DIR}={run_dir} "
             f"{FRESH_STORE}={shlex.quote(env[FRESH_STORE])} {OTHER_PYTHONPATH} "
             f"{shlex.join(command)}")
    if nodes(command) > 1 or not loopback:  # one node: no second command to run
        where = ("the collector listens on loopback only: other machines cannot reach it "
                 "(pass --host IFACE for more than one machine); on this machine run"
                 if loopback else
                 f"the collector listens on {collector.host}; copy {secret_path} to the same "
                 "path on every other node (mode 0600), then run there")
        summary.say(f"other nodes: {where}:\n  {other}")
    # on a terminal the command's own output would break the in-place redraw:
    # it goes to a file, and its tail is shown when the command fails
    log = os.path.join(run_dir, files.LOG_FILE) if summary.tty else None
    if log:
        summary.say(f"the command's output: {log}")
    summary.say(f"watch it from a notebook: torchlens.watch({run_dir!r}) "
                f"or torchlens.watch({address!r}, secret_file={secret_path!r})")
    exporter = (metrics_endpoint.serve(metrics_at, run_dir, summary.say, metrics_token_file)
                if metrics_at else None)
    entry = run_registry.register(key.run_id, run_dir, address, command)  # for the sidebar
    proc = child.start(command, env, log)
    own = _OwnLines(proc.own, summary) if log else None  # relayed as they are otherwise
    interrupted = False
    stopped_by = "Ctrl-C"
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        watch(collector, summary, lambda: proc.poll() is None, feed, exporter, own)
    except KeyboardInterrupt as exc:
        interrupted = True
        stopped_by = "SIGTERM" if isinstance(exc, _Terminated) else stopped_by
        summary.say(f"torchlens run: stopped by {stopped_by}, ending the command's processes")
    finally:
        signal.signal(signal.SIGTERM, previous)
        code = child.end(proc)
        leftovers = child.end_leftovers([s.hello for s in collector.all_slots()])
        child.wait_relay(proc)  # the command's last lines before the summary's
        if own is not None:
            own.say()
        for _ in range(FINAL_POLLS):
            with contextlib.suppress(Exception):
                collector.poll()
            time.sleep(POLL_S / 2)
        view = run_view(collector.snapshot(), ended=True)
        if not interrupted:  # a job can fail where no rank says so (a mistyped script)
            view = job_ended(view, code, list(getattr(proc, "tail", ())), unattached)
        if exporter is not None:  # how each rank ended, for the last scrape
            exporter.tick(collector, view)
        with contextlib.suppress(Exception):  # the folder is written whatever happens
            feed.publish(live_status(view).to_json(), ended=True)
        feed.close()
        manifest = write_folder(run_dir, collector, view, command, code, interrupted,
                                live=feed.manifest_entry())
        feed.linger()  # store watchers read the last frame before the store goes
        if exporter is not None:
            exporter.close(linger=True)
        with contextlib.suppress(OSError):
            os.remove(secret_path)
        collector.close()
        run_registry.unregister(entry)
    summary.final(view, "")
    for e in manifest.ranks:  # not in the live view: the goodbye that says it is the last word
        if e.oom:
            summary.say(f"torchlens run: rank {e.rank}: {e.oom}")
    tail = _tail(log) if log and code != 0 and not interrupted else ""
    if tail:  # after a Ctrl-C the log ends in torchrun's own SignalException: not the news
        summary.say(tail)
    if leftovers:
        summary.say(f"torchlens run: killed {len(leftovers)} rank process(es) their agent "
                    f"left behind: {', '.join(map(str, leftovers))}")
    status = EXIT_INTERRUPTED if interrupted else _exit_code(code)
    # one exit status, the one the shell gets
    if interrupted:
        summary.say(f"torchlens run: {manifest.stopped}; stopped by {stopped_by}: "
                    f"exit code {status}" + (f" (the command's output: {log})" if log else ""))
    elif manifest.stopped.startswith("ended with exit code"):
        summary.say(f"torchlens run: {manifest.stopped}")
    else:
        summary.say(f"torchlens run: {manifest.stopped}; exit code {status}")
    summary.say(f"torchlens run: run folder {run_dir}\n  torchlens report {shlex.quote(run_dir)}")
    return status


def watch(collector: Any, summary: Any, running: Callable[[], bool],
          feed: Any | None = None, metrics: Any | None = None, own: Any | None = None) -> None:
    """The live loop: poll the collector, redraw the summary and publish the live
    feed (``capture.ranks.feed``) when due, while ``running()``. One ``RunView``
    serves both when both are due; a frame in between carries the last status
    (``FeedPublisher.status_due``: the verdict's cost stays a small share of
    the loop however many ranks). ``own``: torchlens' own lines in the
    command's output (``_OwnLines``), said above the summary as they come.

    One function for ``run`` and ``benchmarks/bench_collector_load.py``, so the
    benchmark measures the loop a user gets.
    """
    from torchlens.analysis.ranks.verdict import live_status, run_view

    def timed_view() -> Any:
        # its cost spaces out the redraws and the feed's status (many ranks)
        started = time.perf_counter()
        view = run_view(collector.snapshot())
        summary.cost = time.perf_counter() - started
        return view

    while running():
        collector.poll()
        view = None
        if summary.due():
            view = timed_view()
            summary.draw(view, "")
        if feed is not None and feed.due():
            if view is None and feed.status_due(summary.cost):  # costly at many ranks: not every frame
                view = timed_view()
            feed.publish(live_status(view).to_json() if view is not None else None)
        if metrics is not None:  # steps counted every poll; a scrape reads what it kept
            metrics.tick(collector, view)
        if own is not None:
            own.say()
        time.sleep(POLL_S)


class _OwnLines:
    """What torchlens itself said in the ranks (an integration skipped for an
    old version), when the command's output goes to ``command.log``: each line
    once on the terminal, however many ranks said it."""

    def __init__(self, lines: Any, summary: Any) -> None:
        self.lines, self.summary = lines, summary
        self.seen: set[str] = set()

    def say(self) -> None:
        while self.lines:
            line = self.lines.popleft()
            if line not in self.seen:
                self.seen.add(line)
                self.summary.say(line)


class _Output:
    """The summary's stream, for as long as someone reads it. When the reader
    closes it (``| head``), our stdout's descriptor becomes /dev/null: the
    summary, the relayed command output and what is still buffered go there,
    and the run goes on to its end with the exit code it would have had (the
    other commands of ``frontends.cli.main`` end at once with 141 instead)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._went_away()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._went_away()

    def isatty(self) -> bool:
        return not self.gone and self.stream.isatty()

    def _went_away(self) -> None:
        self.gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
            self.stream.flush()  # what was buffered for the gone reader
        except (OSError, ValueError, AttributeError):  # no descriptor: writes are dropped above
            pass


def _tail(path: str) -> str:
    """The log's last lines under a heading; "" for an empty log (no heading alone)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()[-TAIL_LINES:]
    except OSError:
        return ""
    if not any(line.strip() for line in lines):
        return ""
    return "\n".join([f"the last lines of {path}:", *lines])


class _Terminated(KeyboardInterrupt):
    """SIGTERM, told apart from Ctrl-C in what the run says."""


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise _Terminated


def _where_stopped(view: Any, interrupted: bool, code: int | None,
                   raised: dict[int, float] | None = None) -> str:
    """The run's last words. Of the ranks that did not finish, the one whose own
    exception came first leads (``raised``: rank -> when its error was raised,
    from its goodbye); the ranks that failed only because a peer went away come
    last, as one phrase in the transport's few words (``analysis.ranks.crash``):
    on a crash their closed connection is the side effect, not the news."""
    from torchlens.analysis.ranks.crash import peer_gone, peer_gone_words, stopped_when
    from torchlens.analysis.ranks.slow import rank_list

    steps = [r.steps or 0 for r in view.ranks]
    # the same words as the verdict's when nothing was recorded (not "every rank said goodbye")
    none = ("no rank attached, no step recorded"
            if all(r.state == "waiting" for r in view.ranks)
            else "no step recorded" if not any(steps) else "")
    if interrupted:
        return f"interrupted before any step: {none}" if none else (
            f"interrupted after {max(steps)} steps")
    if none and code == 0 and not view.lost and all(
            r.state == "finished" for r in view.ranks):
        return f"the command ended: {none}"
    if view.lost:
        return "stopped: " + "; ".join(n.words for n in view.lost)
    if code == 0 and all(r.state == "finished" for r in view.ranks):
        if view.restarts:  # the step counts are of the last start
            n = len(view.restarts)
            return (f"finished after {n} restart{'s' if n > 1 else ''} by the elastic agent: "
                    f"every rank said goodbye ({min(steps, default=0)} steps or more each "
                    "since the last restart)")
        return f"finished: every rank said goodbye ({min(steps, default=0)} steps or more each)"
    raised = raised or {}

    def first(row: RankRow) -> tuple[float, int]:
        return (raised.get(row.rank, float("inf")), row.rank)

    rows = sorted((r for r in view.ranks if r.state != "finished"), key=first)
    bad = [f"rank {r.rank} {r.state}" + (f" ({r.error})" if r.error else "")
           for r in rows if not peer_gone(r.error)]
    cause = next((r.rank for r in rows if r.state == "failed"
                  and not peer_gone(r.error)), None)
    peers: dict[str, list[RankRow]] = {}  # one phrase per thing the transport said
    for r in rows:
        if peer_gone(r.error):
            peers.setdefault(peer_gone_words(r.error), []).append(r)
    for group in peers.values():
        bad.append(stopped_when(rank_list([r.rank for r in group]),
                                None if cause is None else rank_list([cause]),
                                group[0].error))
    return f"ended with exit code {_exit_code(code)}" + (f": {'; '.join(bad)}" if bad else "")


def _rank_steps(collector: Any, slots: list[Any]) -> Iterator[StepRecord]:
    """Every step record the collector spooled of a rank's ``slots``, in order, each
    saying which start of the rank it is of (0: the first, k: after the job's k-th
    restart, as analysis.ranks.restarts numbers them)."""
    for incarnation, s in enumerate(slots):
        for batch in collector.spool_lines(s.slot, 0):
            try:
                recs, _ = decode_batch(batch)
            except ValueError:
                continue
            for rec in recs:
                yield rec.replace(restart=incarnation)


def write_folder(run_dir: str, collector: Any, view: Any, command: list[str],
                 code: int | None, interrupted: bool,
                 live: LiveEntry | None = None) -> Manifest:
    """``manifest.json``, each rank's ``steps.jsonl`` and ``summaries.jsonl``.

    ``live``: what the live feed wrote (``FeedPublisher.manifest_entry``); its
    files (``live.jsonl``, ``live.json``) stay in the folder.

    The ranks that could write the run folder put their profiled steps'
    traces in ``rank<r>/`` themselves; the manifest lists what is there.
    """
    by_rank: dict[int, list[Any]] = {}
    for s in collector.all_slots():
        by_rank.setdefault(s.rank, []).append(s)
    ranks: list[RankFiles] = []
    raised: dict[int, float] = {}
    for row in view.ranks:
        r = row.rank
        slots = by_rank.get(r, [])
        last = slots[-1] if slots else None
        hello: Hello | None = last.hello if last else None
        hb: Heartbeat = last.heartbeat if last else Heartbeat()
        bye: Bye = (last.bye if last else None) or Bye()
        if bye.error_t is not None:
            raised[r] = bye.error_t
        ranks.append(RankFiles(RankEntry(
            rank=r, node=row.node, host=row.host,
            pid=hello.pid if hello else None, local_rank=hello.local_rank if hello else None,
            # a rank attached at its start says its device in its heartbeats, once it stepped
            device=hb.device or (hello.device if hello else None),
            restart=row.restart, state=row.state, error=row.error,
            stopped_at_step=hb.steps_done, last_heartbeat=hb.t,
            steps=sum(s.counts[0] for s in slots), summaries=sum(s.counts[1] for s in slots)),
            steps=_rank_steps(collector, slots), oom=bye.oom,
            summaries=(line for s in slots for line in collector.spool_lines(s.slot, 1))))
    nodes: dict[Any, NodeEntry] = {}
    for e in (f.entry for f in ranks):
        nodes.setdefault((e.node, e.host), NodeEntry(node=e.node, host=e.host)).ranks.append(e.rank)
    manifest = Manifest(
        source=SOURCE_RUN, world_size=view.world_size, created=time.time(),
        run_id=collector.key.run_id, command=list(command),
        # the status the shell gets, as the last line says it (130 after a Ctrl-C)
        exit_code=EXIT_INTERRUPTED if interrupted else _exit_code(code),
        interrupted=interrupted, stopped=_where_stopped(view, interrupted, code, raised),
        verdict=str(view.verdict), verdict_code=view.verdict.code,
        verdict_ranks=list(view.verdict.ranks),
        nodes=list(nodes.values()),
        lost_nodes=[msgspec.convert(dataclasses.asdict(n), LostNodeEntry) for n in view.lost],
        restarts=[msgspec.convert(dataclasses.asdict(r), RestartEntry) for r in view.restarts],
        started=collector.t0, dropped_messages=collector.dropped,
        dropped_why=dict(collector.dropped_why),
        slow_rank={**dataclasses.asdict(view.slow), "finding": view.slow.finding.to_dict()},
        memory_creep=[msgspec.convert(dataclasses.asdict(c), CreepEntry) for c in view.creep],
        notes=list(view.notes),
        live=live)
    write_run_folder(run_dir, manifest, ranks)
    shutil.rmtree(os.path.join(run_dir, files.SPOOL_DIR), ignore_errors=True)
    return manifest
