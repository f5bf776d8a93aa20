"""Load on the ``torchlens run`` collector from many simulated ranks (issue 14, scale).

For each rank count, a fresh collector process runs the real collector
(``capture.ranks.collector.Collector``) under the real live loop
(``frontends.ranks.command.watch``: poll every 0.25 s, the verdict and per-rank
table computed and drawn about once a second, to a stream that counts as a
terminal), and spawns ``--procs`` simulator processes that play the ranks.
Each simulated rank has its own TCPStore client (as a real rank does) and
sends what ``capture.ranks.attach`` sends, sealed with the run's key and laid
out by the same ``protocol`` functions: its heartbeat and hello, then every
``HEARTBEAT_S`` (0.5 s) a batch of step records into its ring of keys
through the rank's own sender (``attach.StepRing``: never over a value the
collector has not read; held and sent later while it is behind)
(``--steps-per-s`` a second, records shaped as a real rank's), a heartbeat
that counts what it sent, and every second one profiled-step summary (the one
``analysis.ranks.summary.summarize`` makes of a shared A100 DDP trace, ~55 KB
of JSON), for ``--seconds``; then its bye. Ranks' flushes are spread evenly
over the half second, as independent ranks' would be. At the window's end
each rank exits as ``Attachment.close`` does: what it still holds goes to
its ``last`` keys, which its goodbye counts and the collector reads after it.

After the window the collector drains what is left in the store and writes
the run folder as ``torchlens run`` does (``write_folder``); its manifest's
``collector`` entry gives what was kept: step records sent (the simulators
count them) vs kept, profiled-step summaries sent vs kept, sampled out (the
collector's stated rule when it falls behind: ``capture.ranks.collector``)
and overwritten, and the sentence the run's last lines print.

``--load N`` runs N busy Python processes (a spinning loop each) beside the
collector, from when every simulator has connected (``--load-warmup``
seconds before the window opens, the collector already polling) to the
window's end; they are killed then, and each ends itself when the benchmark's process is gone
(Ctrl-C, SIGTERM or a kill leave none behind). The output gives the 1-min
load average seen over each window and the threads runnable on average.

Measured in the collector process, over the sending window:

- messages per second sent (the simulators count them) and taken in (values
  the collector read: step batches, summaries, heartbeat changes; a heartbeat
  overwritten before a poll is superseded, not lost, so heartbeats taken in
  may be fewer than sent);
- backlog: summaries sent but not yet read when the window closed;
- CPU: the collector process's CPU time / wall time (cores; it includes the
  TCPStore server's thread, which lives in that process), less the
  benchmark's own bookkeeping (measured and shown apart);
- memory: RSS at the start of the window, its peak, and its growth over the
  last half of the window (bounded: ~0);
- latency: a summary's send time (``bench_t``, written into the summary by the
  simulator just before ``store.set``) until the collector holds it in its
  state (after the ``poll`` that read it: what the next redraw shows), and
  until the next redraw written to the terminal (``view``), p50/p95/max.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_collector_load.py \\
        [--ranks 64,256,1024] [--seconds 60] [--procs 8] [--load N] \\
        [--trace TRACE.json.gz] [--python PYTHON] [--json OUT.json]

The summary is made of ``--trace`` (default: the shared A100 DDP trace in
``benchmarks/paths.py``'s traces folder, ``$TORCHLENS_TESTDATA``); the
collector, simulator and busy processes run ``--python`` (default: this
interpreter) with this checkout first on ``PYTHONPATH``.

The simulators share the machine's cores with the collector: on a small
machine their load is part of what the collector sees.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any

import paths

TRACE = "a100_ddp_resnet_rank0_nccl.json.gz"  # in ``paths.traces()``, unless --trace
HERE = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(HERE))


# -- the simulated ranks ----------------------------------------------------------
def _record(step: int, t0: float, t1: float) -> dict[str, Any]:
    """One step record as ``stepper.RankProfiler.step`` makes it on a CPU rank."""
    return {"step": step, "t0": t0, "t1": t1,
            "phases": {"data": 0.031, "forward": 0.012, "backward": 0.020,
                       "optimizer": 0.004, "collective": None},
            "profiled": False, "window": False,
            "mem": {"rss": 412_000_000 + 4096 * step, "allocated": None, "reserved": None,
                    "inactive_split": None, "largest_free": None, "source": "rss"},
            "tl_s": 2.1e-05}


class SimRank:
    """One simulated rank: a store client, a slot, and what it has sent."""

    def __init__(self, key: Any, host: str, port: int, rank: int, world: int) -> None:
        import torch.distributed as dist

        from torchlens.capture.channel import protocol
        from torchlens.capture.ranks.attach import StepRing

        self.key, self.rank, self.world = key, rank, world
        self.store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
        self.slot = int(self.store.add(protocol.slots_key(key.run_id), 1)) - 1
        self.ring = StepRing(protocol.Channel(self.store, key), key.run_id, self.slot)
        self.last = 0  # step batches left in its ``last`` keys at exit
        self.prefix = protocol.slot_key(key.run_id, self.slot, "")
        self.sent = {"steps": 0, "prof": 0, "hb": 0}
        self.records = 0  # step records in the batches sent
        self.beat = 0
        self.step = 0
        self.t_step = time.time()

    def put(self, what: str, body: bytes) -> None:
        name = self.prefix + what
        self.store.set(name, self.key.seal(name, body))

    def numbered(self, kind: str, body: bytes) -> None:
        """Summary number ``sent[kind]`` into its ring key, as ``Attachment._set_summary``."""
        from torchlens.capture.channel import protocol

        name = protocol.ring_key(self.key.run_id, self.slot, kind, self.sent[kind])
        self.store.set(name, self.key.seal(name, body))
        self.sent[kind] += 1

    def heartbeat(self, bye: dict[str, Any] | None = None) -> None:
        from torchlens.capture.channel import protocol

        self.beat += 1
        hb = {"t": time.time(), "beat": self.beat, "rss": 412_000_000,
              "sent": [self.ring.sent, self.sent["prof"]],
              "steps_done": self.step, "phase_calls": 5 * self.step,
              "held": len(self.ring.held), "shed": self.ring.shed,
              "skipped": self.ring.skipped}
        if self.last:
            hb["last"] = self.last
        if bye is not None:
            hb["bye"] = bye
        self.put("hb", protocol.encode(hb))
        self.sent["hb"] += 1

    def start(self) -> None:
        from torchlens.capture.channel import protocol

        self.heartbeat()
        self.put("hello", protocol.encode({
            "rank": self.rank, "world_size": self.world, "local_rank": self.rank % 8,
            "node": self.rank // 8, "host": f"sim-node{self.rank // 8}", "pid": os.getpid(),
            "restart": 0, "elastic_run_id": "bench", "slot": self.slot, "t": time.time(),
            "device": "cpu", "run_dir": os.path.join(tempfile.gettempdir(), "none"), "shared_run_dir": True}))
        protocol.enroll(protocol.Channel(self.store, self.key), self.key.run_id, self.rank,
                        self.slot)

    def flush(self, steps_per_s: float, summary: tuple[dict[str, Any], bytes] | None) -> None:
        """What ``Attachment._flush`` sends: a step batch, a summary (if one is due), a heartbeat."""
        from torchlens.capture.channel import protocol

        now = time.time()
        due = int((now - self.t_step) * steps_per_s)
        if due:
            dt = 1.0 / steps_per_s
            records = [_record(self.step + i, self.t_step + i * dt, self.t_step + (i + 1) * dt)
                       for i in range(due)]
            self.step += due
            self.t_step += due * dt
            self.records += due
            self.ring.put(records)
        self.ring.send()
        self.sent["steps"] = self.ring.sent
        if summary is not None and self.ring.summary_room(self.sent["prof"]):
            # protocol.pack_summary's layout, its ~50 KB rest encoded once for all
            # sends; the head gets this rank, step and the time of sending
            head, rest = summary
            self.numbered("prof", protocol.pack(
                self.sent["prof"], rest,
                {**head, "rank": self.rank, "step": self.step, "bench_t": time.time()}))
        self.heartbeat()


def simulate(spec: dict[str, Any]) -> dict[str, Any]:
    """Play ``spec['ranks']`` ranks until ``spec['end']``; what they sent."""
    from torchlens.capture.channel.signing import RunKey
    from torchlens.capture.ranks.attach import HEARTBEAT_S

    key = RunKey(spec["run_id"], bytes.fromhex(spec["secret"]))
    from torchlens.capture.channel import protocol

    with open(spec["summary_path"], "rb") as fh:
        head, rest = protocol.unpack(protocol.pack_summary(0, json.loads(fh.read())))
    head.pop("seq")
    summary = (head, rest)
    # one simulator connects at a time: the store's server takes serial connects
    # in well under a millisecond each, concurrent ones in up to seconds each
    with open(spec["lock"], "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sims = [SimRank(key, spec["host"], spec["port"], r, spec["world"])
                for r in spec["ranks"]]
        fcntl.flock(lock, fcntl.LOCK_UN)
    print("ready", flush=True)
    spec.update(json.loads(sys.stdin.readline()))  # the common start and end
    while time.time() < spec["start"]:
        time.sleep(0.01)
    cpu0 = sum(os.times()[:2])
    for s in sims:
        s.start()
    world = spec["world"]
    # flush times spread evenly over the half second by rank; a summary every other flush
    offsets = [HEARTBEAT_S * (r / world) for r in spec["ranks"]]
    t0, n, late = time.time(), 0, 0.0
    while True:
        round_t = t0 + n * HEARTBEAT_S
        if round_t >= spec["end"]:
            break
        for s, off in zip(sims, offsets, strict=True):
            when = round_t + off
            wait = when - time.time()
            if wait > 0:
                time.sleep(wait)
            else:
                late = max(late, -wait)
            s.flush(spec["steps_per_s"], summary if n % 2 == (s.rank % 2) else None)
        n += 1
    # their exit (``Attachment.close``): what a rank still holds goes to its
    # ``last`` keys, counted by its goodbye; it never waits for the collector
    held_at_exit = sum(len(s.ring.held) for s in sims)
    for s in sims:
        s.last = s.ring.send_last()
        s.sent["steps"] = s.ring.sent
        s.heartbeat(bye={"t": time.time(), "reason": "exit", "error": None,
                         "steps": s.step, "errors": []})
    sent = {k: sum(s.sent[k] for s in sims) for k in ("steps", "prof", "hb")}
    sent["records"] = sum(s.records for s in sims)
    return {"sent": sent, "late_max_s": late, "cpu_s": sum(os.times()[:2]) - cpu0,
            "held_at_exit": held_at_exit, "shed": sum(s.ring.shed for s in sims)}


# -- the collector process ----------------------------------------------------------
class _Terminal:
    """A stream that says it is a terminal and notes when each frame was written."""

    def __init__(self) -> None:
        self.frames: list[float] = []
        self.chars = 0

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.chars += len(text)
        return len(text)

    def flush(self) -> None:
        self.frames.append(time.time())


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _watch_on(collector: Any, summary: Any, end: float, feed: Any,
              failures: dict[str, int]) -> None:
    """``watch`` until ``end`` as ``torchlens run`` does (``_watch_failing_open``):
    a failure of the loop is counted, and it watches again after ``RETRY_S``."""
    from torchlens.frontends.ranks.command import RETRY_S, watch

    while time.time() < end:
        try:
            watch(collector, summary, lambda: time.time() < end, feed)
        except Exception as exc:  # noqa: BLE001 - counted, as the run counts it
            why = f"{type(exc).__name__}: {str(exc)[:120]}"
            failures[why] = failures.get(why, 0) + 1
            time.sleep(min(RETRY_S, max(0.0, end - time.time())))


def collect(args: argparse.Namespace, n: int, summary_path: str) -> dict[str, Any]:
    """One run: the collector here, the ranks in ``args.procs`` processes."""
    import msgspec
    import psutil

    from torchlens.capture.channel.signing import RunKey
    from torchlens.capture.ranks.collector import Collector
    from torchlens.render.ranks.terminal import TerminalSummary

    book = {"cpu": 0.0}
    arrived: list[tuple[float, float]] = []  # (bench_t, when the collector held it)
    read = {"steps": 0, "prof": 0, "hb": 0}
    polls: list[float] = []
    sent_t: list[float] = []

    class Timed(Collector):
        """The collector, with the benchmark's bookkeeping after each poll (timed apart)."""

        def _take(self, s: Any, kind: int, head: dict[str, Any], payload: bytes) -> Any:
            if kind == 1 and "bench_t" in head:
                sent_t.append(head["bench_t"])
            return super()._take(s, kind, head, payload)

        def poll(self) -> None:
            t = time.perf_counter()
            super().poll()
            polls.append(time.perf_counter() - t)
            now, c0 = time.time(), time.thread_time()
            arrived.extend((x, now) for x in sent_t)
            del sent_t[:]
            seen = self.__dict__.setdefault("_seen", {})
            for s in self.slots.values():
                last = seen.get(s.slot, (0, 0, 0))
                beat = int(s.heartbeat.beat or 0)
                taken = [s.read[k] - s.overwritten[k] for k in (0, 1)]
                read["steps"] += taken[0] - last[0]
                read["prof"] += taken[1] - last[1]
                read["hb"] += beat > last[2]
                seen[s.slot] = (taken[0], taken[1], max(beat, last[2]))
            book["cpu"] += time.thread_time() - c0

    import shutil

    from torchlens.capture.ranks.feed import FeedPublisher

    key = RunKey.new()
    # as ``torchlens run``: everything spooled to the run folder, the live feed
    # published to it and to the store
    run_dir = tempfile.mkdtemp(prefix="tl-bench-run-")
    collector = Timed(key, spool=os.path.join(run_dir, ".spool"))
    feed = FeedPublisher(collector, run_dir)
    me = psutil.Process()
    terminal = _Terminal()
    summary = TerminalSummary(terminal, tty=True)  # type: ignore[arg-type]
    per = [list(range(n))[i::args.procs] for i in range(args.procs)]
    failures: dict[str, int] = {}
    load = Load(args.load, args.python)
    procs = []
    rss: list[tuple[float, int]] = []
    loads: list[tuple[float, float, int]] = []  # (when, 1-min load average, runnable now)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            rss.append((time.time(), me.memory_info().rss))
            loads.append((time.time(), os.getloadavg()[0], _runnable()))

    try:
        for ranks in per:
            spec = {"run_id": key.run_id, "secret": key.secret.hex(), "host": collector.host,
                    "port": collector.port, "ranks": ranks, "world": n,
                    "steps_per_s": args.steps_per_s, "summary_path": summary_path,
                    "lock": summary_path + ".lock"}
            procs.append(subprocess.Popen(
                [args.python, HERE, "--simulate", json.dumps(spec)], stdout=subprocess.PIPE,
                stdin=subprocess.PIPE, text=True,
                env={**_env(), "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}))
        for p in procs:  # every simulator connected its ranks' clients
            assert p.stdout is not None and p.stdin is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a simulator did not start")
        # the busy processes from now (every simulator connected) to the window's end
        load.start()
        start = time.time() + 1.0 + (args.load_warmup if load.n else 0.0)
        end = start + args.seconds
        for p in procs:
            p.stdin.write(json.dumps({"start": start, "end": end}) + "\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        threading.Thread(target=sample, daemon=True).start()
        _watch_on(collector, summary, start, feed, failures)
        cpu0, w0, rss0 = sum(os.times()[:2]), time.time(), me.memory_info().rss
        book["cpu"] = 0.0
        del arrived[:]
        del polls[:]
        read.update(steps=0, prof=0, hb=0)
        frames0 = len(terminal.frames)
        prof = None
        if args.cprofile:  # where the collector's time goes (the figures then include its cost)
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        _watch_on(collector, summary, end, feed, failures)
        load.stop()
        if prof is not None:
            prof.disable()
            prof.dump_stats(args.cprofile)
        cpu1, w1 = sum(os.times()[:2]), time.time()
        in_window = dict(read)
        poll_s = list(polls)
        bench_cpu = book["cpu"]
        got = list(arrived)
        frames = terminal.frames[frames0:]
        # the ranks' exit: they wait for room for what they hold while the
        # collector polls on, as ``torchlens run``'s live loop does
        while any(p.poll() is None for p in procs) and time.time() - end < 120:
            try:
                collector.poll()
            except Exception as exc:  # noqa: BLE001 - a busy store: counted, polled again
                why = f"{type(exc).__name__}: {str(exc)[:120]}"
                failures[why] = failures.get(why, 0) + 1
            time.sleep(0.25)
        outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
        # what was still in the store when the window closed, drained
        drain0 = time.time()

        def resolved() -> bool:  # every value sent kept, sampled out or counted as overwritten
            t = collector.tally()
            return (all(s.bye is not None for s in collector.slots.values())
                    and not collector._again  # goodbyes' last batches read
                    and t.step_batches_sent >= sum(o["sent"]["steps"] for o in outs)
                    and t.summaries_sent >= sum(o["sent"]["prof"] for o in outs)
                    and t.summaries_kept + t.summaries_sampled + t.summaries_overwritten
                    >= t.summaries_sent)

        while not resolved() and time.time() - drain0 < 30:
            try:
                collector.poll()
            except Exception as exc:  # noqa: BLE001 - a busy store: counted, polled again
                why = f"{type(exc).__name__}: {str(exc)[:120]}"
                failures[why] = failures.get(why, 0) + 1
            time.sleep(0.25)
        drain_s = time.time() - drain0
        # the run folder as ``torchlens run`` writes it: its manifest says what was kept
        from torchlens.analysis.ranks.verdict import run_view
        from torchlens.frontends.ranks.command import write_folder

        write_folder(run_dir, collector, run_view(collector.snapshot()), ["bench"], 0, False,
                     live=feed.manifest_entry())
        from torchlens.formats.run_folder.manifest import read_manifest

        kept = read_manifest(run_dir).collector
        assert kept is not None
    finally:
        load.stop()
        stop.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        feed.close()
        collector.close()
        disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(run_dir) for f in fs)
        shutil.rmtree(run_dir, ignore_errors=True)
    wall = w1 - w0
    sent = {k: sum(o["sent"][k] for o in outs) for k in ("steps", "prof", "hb")}
    records_sent = sum(o["sent"]["records"] for o in outs)
    state = [t_in - t_sent for t_sent, t_in in got]
    view = []
    for t_sent, t_in in got:
        drawn = next((f for f in frames if f >= t_in), None)
        if drawn is not None:
            view.append(drawn - t_sent)
    half = [r for t, r in rss if t >= w0 + wall / 2 and t <= w1]
    seen = [(la, run) for t, la, run in loads if w0 <= t <= w1]
    return {
        "ranks": n, "seconds": wall,
        "sent_per_s": sum(sent.values()) / wall, "in_per_s": sum(in_window.values()) / wall,
        "sent": sent, "read": in_window, "backlog_prof": sent["prof"] - in_window["prof"],
        "drain_s": drain_s, "read_after_drain": read["prof"],
        "cores": (cpu1 - cpu0 - bench_cpu) / wall, "bench_cores": bench_cpu / wall,
        "rss0_mb": rss0 / 2**20, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_growth_mb_2nd_half": (max(half) - min(half)) / 2**20 if half else None,
        "rss_end_mb": me.memory_info().rss / 2**20,
        "lat_state": [_pct(state, 0.5), _pct(state, 0.95), max(state, default=None)],
        "lat_view": [_pct(view, 0.5), _pct(view, 0.95), max(view, default=None)],
        "frames": len(frames), "poll_ms": [_pct(poll_s, 0.5), max(poll_s, default=None)], "sim_late_max_s": max(o["late_max_s"] for o in outs),
        "sim_cores": sum(o["cpu_s"] for o in outs) / wall,
        "dropped": collector.dropped, "run_dir_mb": disk / 2**20,
        "feed": msgspec.to_builtins(feed.manifest_entry()),
        "overwritten": [sum(s.overwritten[k] for s in collector.slots.values()) for k in (0, 1)],
        # what the run's manifest says it kept (after the drain), and in which words
        "records_sent": records_sent, "records_kept": kept.step_records_kept,
        "batches_overwritten": kept.step_batches_overwritten,
        "records_shed": kept.step_records_shed,
        "held_at_exit": sum(o["held_at_exit"] for o in outs),
        "summaries_sent": sent["prof"], "summaries_kept": kept.summaries_kept,
        "summaries_sampled": kept.summaries_sampled,
        "summaries_overwritten": kept.summaries_overwritten, "stride_max": kept.stride_max,
        "summaries_skipped": kept.summaries_skipped,
        "manifest_words": kept.words,
        "loop_failures": failures,
        "poll_ms_all": [_pct(poll_s, 0.5), _pct(poll_s, 0.95), max(poll_s, default=None)],
        "load_1min": [min((la for la, _ in seen), default=None),
                      max((la for la, _ in seen), default=None)],
        "runnable_mean": (sum(run for _, run in seen) / len(seen)) if seen else None}


def _runnable() -> int:
    """Threads runnable on the machine now (``/proc/loadavg``'s fourth field), or -1."""
    try:
        with open("/proc/loadavg", encoding="ascii") as fh:
            return int(fh.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return -1


def _env() -> dict[str, str]:
    """The environment of the processes this benchmark starts: this checkout's
    torchlens first on ``PYTHONPATH``."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": REPO + (os.pathsep + path if path else "")}


def _summary_file(trace: str) -> str:
    """The shared trace's profiled-step summary as JSON, without its rank and step."""
    from torchlens.analysis.ranks.summary import summarize
    from torchlens.capture.channel import protocol
    from torchlens.formats.kineto import load_trace

    summary = summarize(load_trace(trace), rank=0, step=1, trace_rel="rank0/step00001.json")
    summary.pop("rank")
    summary.pop("step")
    path = os.path.join(tempfile.gettempdir(), f"tl-bench-summary-{os.getpid()}.json")
    with open(path, "wb") as fh:
        fh.write(protocol.encode(summary))
    return path


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _n(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def table(rows: list[dict[str, Any]]) -> str:
    """Per rank count: what was sent and kept, the collector's poll, cores and
    memory, and the load it ran under."""
    head = (f"{'ranks':>5} {'load 1m':>9} {'step records sent/kept':>22} "
            f"{'summaries made/kept/sampled/skipped/overwritten':>47} {'k max':>5} "
            f"{'poll ms p50/p95/max':>19} {'cores':>5} {'rss MB start/peak':>17} "
            f"{'state ms p50/p95':>16} {'msg/s sent/in':>13} {'sim cores':>9}")
    out = [head]
    for r in rows:
        load = "/".join(_n(v) for v in r["load_1min"])
        records = f"{r['records_sent']:,}/{r['records_kept']:,}"
        if r.get("records_shed"):
            records += f" ({r['records_shed']:,} shed)"
        rss = f"{r['rss0_mb']:.0f}/{r['peak_rss_mb']:.0f}"
        rate = f"{r['sent_per_s']:.0f}/{r['in_per_s']:.0f}"
        summaries = (f"{r['summaries_sent'] + r['summaries_skipped']:,}/"
                     f"{r['summaries_kept']:,}/{r['summaries_sampled']:,}/"
                     f"{r['summaries_skipped']:,}/{r['summaries_overwritten']:,}")
        out.append(
            f"{r['ranks']:>5} {load:>9} {records:>22} {summaries:>47} {r['stride_max']:>5} "
            f"{'/'.join(_ms(v) for v in r['poll_ms_all']):>19} {r['cores']:>5.2f} "
            f"{rss:>17} "
            f"{'/'.join(_ms(v) for v in r['lat_state'][:2]):>16} "
            f"{rate:>13} {r['sim_cores']:>9.2f}")
    return "\n".join(out)


#: a busy process: spins until killed, or its parent (this benchmark) is gone
SPIN = ("import ctypes, os, signal\n"
        "try:\n"
        "    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)\n"
        "except (OSError, AttributeError):\n"
        "    pass\n"
        "parent = int(os.environ['TL_BENCH_PARENT'])\n"
        "while os.getppid() == parent:\n"
        "    for _ in range(200_000):\n"
        "        pass\n")


class Load:
    """``n`` busy Python processes from ``start`` to ``stop``; each also ends
    itself when this process is gone (no orphans, even after a Ctrl-C or a kill)."""

    def __init__(self, n: int, python: str) -> None:
        self.n, self.python = n, python
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        env = {**os.environ, "TL_BENCH_PARENT": str(os.getpid())}
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([self.python, "-c", SPIN], env=env,
                                               stdin=subprocess.DEVNULL))

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the run as Ctrl-C does: through the ``finally``s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="64,256,1024")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--steps-per-s", type=float, default=4.0)
    parser.add_argument("--load", type=int, default=0,
                        help="busy processes beside the collector for each measured run")
    parser.add_argument("--load-warmup", type=float, default=20.0,
                        help="seconds the busy processes run before each window opens "
                        "(the collector already polling)")
    parser.add_argument("--trace", help="the Kineto trace a summary is made of "
                        f"(default: {TRACE} in benchmarks/paths.py's traces)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter of the collector, simulator and busy processes "
                        "(default: this one; it must import torch and psutil)")
    parser.add_argument("--simulate", help=argparse.SUPPRESS)
    parser.add_argument("--collect", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--summary", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--cprofile", help="cProfile the collector's loop into this file")
    args = parser.parse_args()
    if args.simulate:
        print(json.dumps(simulate(json.loads(args.simulate))))
        return
    if args.collect:
        signal.signal(signal.SIGTERM, _stop)
        print(json.dumps(collect(args, args.collect, args.summary)))
        return
    signal.signal(signal.SIGTERM, _stop)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    path = _summary_file(args.trace or str(paths.traces() / TRACE))
    size = os.path.getsize(path)
    rows = []
    try:
        for n in [int(x) for x in args.ranks.split(",")]:
            load0 = os.getloadavg()
            proc = subprocess.Popen(
                [args.python, HERE, "--collect", str(n), "--summary", path,
                 "--seconds", str(args.seconds), "--procs", str(args.procs),
                 "--steps-per-s", str(args.steps_per_s), "--python", args.python,
                 "--load", str(args.load), "--load-warmup", str(args.load_warmup),
                 *(["--cprofile", f"{args.cprofile}.{n}"] if args.cprofile else [])],
                stdout=subprocess.PIPE, env=_env())
            try:
                out, _ = proc.communicate(timeout=args.seconds + args.load_warmup + 600)
            finally:
                if proc.poll() is None:
                    proc.terminate()  # its ``finally`` ends its simulators and busy processes
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            row = json.loads(out.decode().strip().splitlines()[-1])
            row["load_before"], row["load_after"] = load0, os.getloadavg()
            row["busy_procs"] = args.load
            rows.append(row)
            print(f"{n} ranks: {json.dumps(row)}", file=sys.stderr, flush=True)
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
        with contextlib.suppress(OSError):
            os.remove(path + ".lock")
    print(f"collector load: {args.seconds:.0f} s, {args.procs} simulator processes, "
          f"{args.load} busy processes, summary {size / 1024:.0f} KB JSON, "
          f"{args.steps_per_s:g} steps/s a rank, {os.cpu_count()} cores")
    print(table(rows))
    print("load: 1-min load average min/max over each window, and the runnable threads "
          "on average: " + ", ".join(
              f"{r['ranks']} ranks: {_n(r['load_1min'][0])}-{_n(r['load_1min'][1])}, "
              f"{_n(r['runnable_mean'])} runnable" for r in rows))
    for r in rows:
        for why, times in r["loop_failures"].items():
            print(f"{r['ranks']} ranks: the collector's loop failed {times} time(s) ({why}); "
                  "it watched again after torchlens run's pause, as a run does")
    for r in rows:
        print(f"{r['ranks']} ranks, the run's manifest: "
              + (f"the collector kept {r['manifest_words']}" if r["manifest_words"]
                 else "every step record and summary sent was kept"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
