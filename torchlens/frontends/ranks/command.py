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

from torchlens.analysis.ranks.collector_notes import dropped_words, sampling_words
from torchlens.formats.run_folder import files, spool
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
#: after torchlens' own loop failed: how long until it watches again
RETRY_S = 5.0
#: after the command ends: polls for the last batches its ranks wrote
FINAL_POLLS = 3
TAIL_LINES = 20
#: what a shell reports for Ctrl-C (128 + SIGINT); also after SIGTERM (docs/MULTINODE.md)
EXIT_INTERRUPTED = 130
#: after a SIGTERM: 128 + 15, as a shell says a process that signal ended
EXIT_TERMINATED = 128 + signal.SIGTERM
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
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot make the run folder {out} (--out): {exc.strerror or exc}; "
                         "give a folder that does not exist yet or an empty one, where you "
                         "can write") from None
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
        metrics_token_file: str | None = None, profile: bool = True) -> int:
    """Run ``command`` under the collector; returns its exit code. ``metrics``:
    ``[HOST:]PORT`` to serve Prometheus series at (``metrics_endpoint``);
    ``metrics_token_file``: the user's bearer token for it (else one per run);
    ``profile=False``: the ranks record their steps but run no torch.profiler."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d's store-wait warnings
    command = _check_command(list(command))
    from torchlens.frontends.ranks import launchers, metrics_endpoint
    metrics_at = metrics_endpoint.parse_address(metrics) if metrics else None
    if metrics_token_file is not None:  # checked before the job starts
        if metrics_at is None:
            raise InputError("--metrics-token-file is for --metrics: add --metrics [HOST:]PORT")
        metrics_endpoint.read_token(metrics_token_file)
    run_dir = _out_dir(out)
    from torchlens.analysis.ranks.job_exit import job_ended, output_where
    from torchlens.analysis.ranks.verdict import live_status, run_view
    from torchlens.capture.channel.signing import ENV_RUN_ID, ENV_SECRET_FILE, RunKey
    from torchlens.capture.ranks import torchrun as child
    from torchlens.capture.ranks.attach import ENV_COLLECTOR, ENV_PROFILE, ENV_RUN_DIR
    from torchlens.capture.ranks.collector import Collector
    from torchlens.capture.ranks.descriptors import DescriptorWatch, Reserve
    from torchlens.capture.ranks.feed import FeedPublisher
    from torchlens.render.ranks.terminal import TerminalSummary, verdict_lines

    stream = _Output(stream or sys.stdout)
    key = RunKey.new()
    # held before the store listens: connections to it cannot take these, so the
    # command starts and the folder is written however many are open (a flood)
    reserve = Reserve()
    fds = DescriptorWatch()
    try:
        collector = Collector(key, host, port, spool=os.path.join(run_dir, files.SPOOL_DIR))
    except OSError as exc:
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    address = f"{_reachable_address(collector.host)}:{collector.port}"
    feed = FeedPublisher(collector, run_dir)  # what torchlens.watch reads (docs/MULTINODE.md)
    secret_path = key.write_secret(os.path.join(run_dir, files.SECRET_FILE))
    env = {ENV_COLLECTOR: address, **key.env(), ENV_RUN_DIR: run_dir,
           FRESH_STORE: os.environ.get(FRESH_STORE, "1"), **autoattach.pythonpath(os.environ),
           **({} if profile else {ENV_PROFILE: "0"})}
    summary = TerminalSummary(stream, tty)
    loopback = collector.host in LOOPBACK
    summary.say_words(f"torchlens run: run {key.run_id}, collector {address}, "
                      f"run folder {run_dir}")
    if (unattached := launchers.accelerate_cpu(command)) is not None:
        summary.say_words(f"torchlens run: {unattached}")
    other = (f"{ENV_COLLECTOR}={address} {ENV_RUN_ID}={key.run_id} "
             f"{ENV_SECRET_FILE}={secret_path} {ENV_RUN_DIR}={run_dir} "
             f"{FRESH_STORE}={shlex.quote(env[FRESH_STORE])} {OTHER_PYTHONPATH} "
             + ("" if profile else f"{ENV_PROFILE}=0 ") +
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
    summary.say_words(f"watch it from a notebook: torchlens.watch({run_dir!r}) "
                      f"or torchlens.watch({address!r}, secret_file={secret_path!r})")
    exporter = (metrics_endpoint.serve(metrics_at, run_dir, summary.say, metrics_token_file)
                if metrics_at else None)
    try:
        entry = run_registry.register(key.run_id, run_dir, address, command)  # for the sidebar
    except OSError:  # out of descriptors: the sidebar does not list this run
        entry = None
    with contextlib.suppress(OSError):  # who owns the spool: a rebuild checks it is gone
        spool.write_command(spool.spool_dir(run_dir), spool.SpoolCommand(
            pid=os.getpid(), pid_start=run_registry.process_start(os.getpid()),
            host=socket.gethostname(), run_id=key.run_id, started=collector.t0,
            command=list(command)))
    reserve.release()
    proc = _start(child.start, command, env, log)
    reserve.take()
    own = _OwnLines(proc.own, summary) if log else None  # relayed as they are otherwise
    interrupted = False
    stopped_by = "Ctrl-C"
    lost: list[str] = []  # what torchlens failed to do, said at the end
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    # the terminal closed (a dropped ssh session): nobody reads the summary any
    # more, but the job runs on and its run folder is still written at its end
    hangup = signal.signal(signal.SIGHUP, lambda *_: _hung_up(stream))
    try:
        _watch_failing_open(collector, summary, proc, feed, exporter, own, lost, fds)
    except KeyboardInterrupt as exc:
        interrupted = True
        stopped_by = "SIGTERM" if isinstance(exc, _Terminated) else stopped_by
        summary.say(f"torchlens run: stopped by {stopped_by}, ending the command's processes")
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGHUP, hangup)
        reserve.release()  # for the last polls, the feed's last frame and the folder
        code = child.end(proc)
        leftovers = child.end_leftovers([s.hello for s in collector.all_slots()])
        child.wait_relay(proc)  # the command's last lines before the summary's
        if own is not None:
            own.say()
        for _ in range(FINAL_POLLS):
            with contextlib.suppress(Exception):
                collector.poll()
            time.sleep(POLL_S / 2)
        view = run_view(collector.snapshot(), ended=True, interrupted=interrupted)
        if not interrupted:  # a job can fail where no rank says so (a mistyped script)
            view = job_ended(view, code, list(getattr(proc, "tail", ())), unattached)
        view = output_where(view, log)  # the path of the output a failure's advice names
        if exporter is not None:  # how each rank ended, for the last scrape
            exporter.tick(collector, view)
        with contextlib.suppress(Exception):  # the folder is written whatever happens
            feed.publish(live_status(view).to_json(), ended=True)
        feed.close()
        try:
            manifest = write_folder(run_dir, collector, view, command, code, interrupted,
                                    live=feed.manifest_entry(),
                                    stopped_status=_stopped_status(stopped_by))
        except Exception as exc:  # noqa: BLE001 - a full disk: the verdict is still said
            lost.append(f"the run folder could not be written ({type(exc).__name__}: {exc}); "
                        f"what the collector spooled of what the ranks sent is in "
                        f"{os.path.join(run_dir, files.SPOOL_DIR)}")
            manifest = Manifest(world_size=view.world_size,
                                stopped=_where_stopped(view, interrupted, code))
        fds.check()
        fds.close()
        lost += _lost_files(fds.full, feed.errors, collector.port)
        if any(collector.unspooled):
            batches, summaries = collector.unspooled
            lost.insert(0, f"{batches} step batches and {summaries} profiled-step summaries the "
                        f"collector read could not be written to its spool "
                        f"({collector.spool_error}): they are missing from the run folder")
        feed.linger()  # store watchers read the last frame before the store goes
        if exporter is not None:
            exporter.close(linger=True)
        with contextlib.suppress(OSError):
            os.remove(secret_path)
        collector.close()
        run_registry.finish(entry)  # the sidebar lists the finished run a while
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
    status = _stopped_status(stopped_by) if interrupted else _exit_code(code)
    # one exit status, the one the shell gets
    if interrupted:
        summary.say_words(f"torchlens run: {manifest.stopped}; stopped by {stopped_by}: "
                          f"exit code {status}"
                          + (f" (the command's output: {log})" if log else ""))
    elif manifest.stopped.startswith("ended with exit code"):
        summary.say_words(f"torchlens run: {manifest.stopped}")
    else:
        summary.say_words(f"torchlens run: {manifest.stopped}; exit code {status}")
    if manifest.dropped_messages:  # what someone other than the ranks wrote, by reason
        summary.say_words(f"torchlens run: dropped {manifest.dropped_messages}: "
                          f"{dropped_words(manifest.dropped_why)} (not from this run's ranks: "
                          "never read further)")
    if manifest.collector is not None and manifest.collector.words:
        summary.say_words(f"torchlens run: the collector kept {manifest.collector.words}")
    for words in lost:
        summary.say_words(f"torchlens run: lost: {words}")
    summary.say(f"torchlens run: run folder {run_dir}\n  torchlens report {shlex.quote(run_dir)}")
    if stream.gone:  # the reader left (| head): the verdict and the folder, on stderr
        with contextlib.suppress(OSError, ValueError):
            print("\n".join([*verdict_lines(view), f"torchlens run: run folder {run_dir}"]),
                  file=sys.stderr, flush=True)
    return status


def _start(start: Callable[..., Any], command: list[str], env: dict[str, str],
           log: str | None, tries: int = 20) -> Any:
    """``start(command, env, log)``, tried again for a while when the process is
    out of descriptors (``EMFILE``: connections to the store took them between
    the reserve's release and the start): the job must start all the same."""
    import errno

    for i in range(tries):
        try:
            return start(command, env, log)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or i == tries - 1:
                raise
            time.sleep(POLL_S)
    raise AssertionError("unreachable")


def _lost_files(full: Any, feed_errors: dict[str, str], port: int) -> list[str]:
    """What the run lost to its own descriptors running out (``full``: a
    ``descriptors.Exhaustion``) and to its live feed's failed writes, in words."""
    out = []
    if full is not None:
        sockets = (f", {full.sockets:,} of them sockets: connections to its store port {port}"
                   if full.sockets > 0 else "")
        out.append(f"the collector ran out of file descriptors from {full.since} ({full.peak:,} "
                   f"open, its limit RLIMIT_NOFILE {full.limit:,}{sockets}): ranks that "
                   "connected then were turned away (their records and steps are missing) and "
                   "its own files could not be opened; raise the limit (ulimit -n) or end "
                   "whatever holds connections to that port")
    for transport, error in sorted(feed_errors.items()):
        out.append(f"live feed frames for torchlens.watch ({transport}: {error})")
    return out


def _watch_failing_open(collector: Any, summary: Any, proc: Any, feed: Any, exporter: Any,
                        own: Any, lost: list[str], fds: Any = None) -> None:
    """``watch`` until the job ends, whatever torchlens' own loop raises: a full
    disk or too many open files must never end the job. After a failure the
    loop waits ``RETRY_S`` and watches again (what the ranks sent meanwhile
    waits in the store); each failure is added to ``lost`` and said once."""
    failures: dict[str, list[Any]] = {}  # what it raised -> [first time, count]
    def running() -> bool:
        if fds is not None:
            fds.check()
        return proc.poll() is None

    try:
        while proc.poll() is None:
            try:
                watch(collector, summary, running, feed, exporter, own)
                return
            except Exception as exc:  # noqa: BLE001 - torchlens' own failure never ends the job
                why = f"{type(exc).__name__}: {exc}"
                if why not in failures:
                    failures[why] = [time.strftime("%H:%M:%S"), 0]
                    summary.say(f"torchlens run: the collector failed ({why}); the job goes "
                                f"on, watched again in {RETRY_S:g} s (Ctrl-C ends it)")
                failures[why][1] += 1
                deadline = time.monotonic() + RETRY_S
                while proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(POLL_S)
    finally:
        for why, (first, count) in failures.items():
            times = f"{count} times from {first}" if count > 1 else f"at {first}"
            lost.append(f"the collector failed {times} ({why}); it paused {RETRY_S:g} s "
                        "after each failure while the ranks' records waited in its store "
                        "(a note above says if any were overwritten before it read them)")


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
            except OSError:  # EPIPE: the reader left; EIO: the terminal hung up
                self._went_away()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except OSError:
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


def _hung_up(stream: _Output) -> None:
    """SIGHUP: the summary and our stderr (where the command's stderr is relayed)
    go to /dev/null; the run goes on."""
    stream._went_away()
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)


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


def _stopped_status(stopped_by: str) -> int:
    """The exit status of a run stopped by ``stopped_by`` ("Ctrl-C" or "SIGTERM")."""
    return EXIT_TERMINATED if stopped_by == "SIGTERM" else EXIT_INTERRUPTED


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
    from torchlens.analysis.ranks.crash import (
        left_early,
        peer_gone,
        peer_gone_words,
        stopped_when,
    )
    from torchlens.analysis.ranks.slow import rank_list

    steps = [r.steps or 0 for r in view.ranks]
    # the same words as the verdict's when nothing was recorded (not "every rank said goodbye")
    none = ("no rank attached, no step recorded"
            if all(r.state == "waiting" for r in view.ranks)
            else "no step recorded" if not any(steps) else "")
    if interrupted:  # in the rank table's words: a rank that said goodbye finished
        from torchlens.analysis.ranks.job_exit import interrupted_words
        return interrupted_words(view)
    if none and code == 0 and not view.lost and all(
            r.state == "finished" for r in view.ranks):
        return f"the command ended: {none}"
    if view.lost:
        return "stopped: " + "; ".join(n.words for n in view.lost)
    # a rank that stopped for a while and came back (analysis.ranks.silence) finished
    # too: its spell is part of how the run went
    spells = "".join(f"; {words}" for words in getattr(view, "spells", []))
    if code == 0 and all(r.state == "finished" for r in view.ranks):
        if view.restarts:  # the step counts are of the last start
            n = len(view.restarts)
            return (f"finished after {n} restart{'s' if n > 1 else ''} by the elastic agent: "
                    f"every rank said goodbye ({min(steps, default=0)} steps or more each "
                    f"since the last restart){spells}")
        return (f"finished: every rank said goodbye ({min(steps, default=0)} steps or more "
                f"each){spells}")
    raised = raised or {}

    def first(row: RankRow) -> tuple[float, bool, int]:
        # the rank that raised first, then one that ended by itself (exit code 2:
        # a mistyped script) before those its agent then ended with SIGTERM
        ended_by_agent = "SIGTERM" in f"{row.state} {row.error or ''}"
        return (raised.get(row.rank, float("inf")), ended_by_agent, row.rank)

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
        left = left_early(view.ranks, {}) if cause is None else []
        gone = rank_list([cause]) if cause is not None else rank_list(left) if left else None
        bad.append(stopped_when(rank_list([r.rank for r in group]), gone, group[0].error))
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
                 live: LiveEntry | None = None,
                 stopped_status: int = EXIT_INTERRUPTED) -> Manifest:
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
    tally = collector.tally()
    tally.words = sampling_words(tally)
    manifest = Manifest(
        source=SOURCE_RUN, world_size=view.world_size, created=time.time(),
        run_id=collector.key.run_id, command=list(command),
        # the status the shell gets, as the last line says it (130 after a Ctrl-C,
        # 143 after a SIGTERM)
        exit_code=stopped_status if interrupted else _exit_code(code),
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
        live=live, collector=tally)
    write_run_folder(run_dir, manifest, ranks)
    shutil.rmtree(os.path.join(run_dir, files.SPOOL_DIR), ignore_errors=True)
    return manifest
