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
(``--steps-per-s`` a second, records shaped as a real rank's), a heartbeat
that counts what it sent, and every second one profiled-step summary (the one
``analysis.ranks.summary.summarize`` makes of a shared A100 DDP trace, ~55 KB
of JSON), for ``--seconds``; then its bye. Ranks' flushes are spread evenly
over the half second, as independent ranks' would be.

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
        [--ranks 64,256,1024] [--seconds 60] [--procs 8]

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
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from typing import Any

import paths

TRACE = str(paths.traces() / "a100_ddp_resnet_rank0_nccl.json.gz")
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

        self.key, self.rank, self.world = key, rank, world
        self.store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=60))
        self.slot = int(self.store.add(protocol.slots_key(key.run_id), 1)) - 1
        self.prefix = protocol.slot_key(key.run_id, self.slot, "")
        self.sent = {"steps": 0, "prof": 0, "hb": 0}
        self.beat = 0
        self.step = 0
        self.t_step = time.time()

    def put(self, what: str, body: bytes) -> None:
        name = self.prefix + what
        self.store.set(name, self.key.seal(name, body))

    def numbered(self, kind: str, body: bytes) -> None:
        """Value number ``sent[kind]`` into its ring key, as ``Attachment._set_numbered``."""
        from torchlens.capture.channel import protocol

        name = protocol.ring_key(self.key.run_id, self.slot, kind, self.sent[kind])
        self.store.set(name, self.key.seal(name, body))
        self.sent[kind] += 1

    def heartbeat(self, bye: dict[str, Any] | None = None) -> None:
        from torchlens.capture.channel import protocol

        self.beat += 1
        hb = {"t": time.time(), "beat": self.beat, "rss": 412_000_000,
              "sent": [self.sent["steps"], self.sent["prof"]],
              "steps_done": self.step, "phase_calls": 5 * self.step}
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
            self.numbered("steps", protocol.pack(self.sent["steps"], protocol.encode(records)))
        if summary is not None:
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
    for s in sims:
        s.heartbeat(bye={"t": time.time(), "reason": "exit", "error": None,
                         "steps": s.step, "errors": []})
    sent = {k: sum(s.sent[k] for s in sims) for k in ("steps", "prof", "hb")}
    return {"sent": sent, "late_max_s": late, "cpu_s": sum(os.times()[:2]) - cpu0}


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


def collect(args: argparse.Namespace, n: int, summary_path: str) -> dict[str, Any]:
    """One run: the collector here, the ranks in ``args.procs`` processes."""
    import psutil

    from torchlens.capture.channel.signing import RunKey
    from torchlens.capture.ranks.collector import Collector
    from torchlens.frontends.ranks.command import watch
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
                beat = int(s.heartbeat.get("beat") or 0)
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
    procs = []
    rss: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            rss.append((time.time(), me.memory_info().rss))

    try:
        for ranks in per:
            spec = {"run_id": key.run_id, "secret": key.secret.hex(), "host": collector.host,
                    "port": collector.port, "ranks": ranks, "world": n,
                    "steps_per_s": args.steps_per_s, "summary_path": summary_path,
                    "lock": summary_path + ".lock"}
            procs.append(subprocess.Popen(
                [sys.executable, HERE, "--simulate", json.dumps(spec)], stdout=subprocess.PIPE,
                stdin=subprocess.PIPE, text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}))
        for p in procs:  # every simulator connected its ranks' clients
            assert p.stdout is not None and p.stdin is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a simulator did not start")
        start = time.time() + 1.0
        end = start + args.seconds
        for p in procs:
            p.stdin.write(json.dumps({"start": start, "end": end}) + "\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        threading.Thread(target=sample, daemon=True).start()
        watch(collector, summary, lambda: time.time() < start, feed)
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
        watch(collector, summary, lambda: time.time() < end, feed)
        if prof is not None:
            prof.disable()
            prof.dump_stats(args.cprofile)
        cpu1, w1 = sum(os.times()[:2]), time.time()
        in_window = dict(read)
        poll_s = list(polls)
        bench_cpu = book["cpu"]
        got = list(arrived)
        frames = terminal.frames[frames0:]
        outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
        # what was still in the store when the window closed, drained
        drain0 = time.time()
        def resolved() -> int:  # read, or counted as overwritten before it could be
            return read["prof"] + sum(s.overwritten[1] for s in collector.slots.values())

        while resolved() < sum(o["sent"]["prof"] for o in outs) and time.time() - drain0 < 30:
            collector.poll()
            time.sleep(0.25)
        drain_s = time.time() - drain0
    finally:
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
    state = [t_in - t_sent for t_sent, t_in in got]
    view = []
    for t_sent, t_in in got:
        drawn = next((f for f in frames if f >= t_in), None)
        if drawn is not None:
            view.append(drawn - t_sent)
    half = [r for t, r in rss if t >= w0 + wall / 2 and t <= w1]
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
        "feed": feed.manifest_entry(),
        "overwritten": [sum(s.overwritten[k] for s in collector.slots.values()) for k in (0, 1)]}


def _summary_file() -> str:
    """The shared trace's profiled-step summary as JSON, without its rank and step."""
    from torchlens.analysis.ranks.summary import summarize
    from torchlens.capture.channel import protocol
    from torchlens.formats.kineto import load_trace

    summary = summarize(load_trace(TRACE), rank=0, step=1, trace_rel="rank0/step00001.json")
    summary.pop("rank")
    summary.pop("step")
    path = os.path.join(tempfile.gettempdir(), f"tl-bench-summary-{os.getpid()}.json")
    with open(path, "wb") as fh:
        fh.write(protocol.encode(summary))
    return path


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'ranks':>5} {'msg/s sent':>10} {'msg/s in':>9} {'backlog':>7} {'cores':>6} "
            f"{'rss MB':>7} {'peak MB':>7} {'growth MB':>9} {'state ms p50/p95/max':>21} "
            f"{'view ms p50/p95/max':>20} {'poll ms p50/max':>15} {'sim cores':>9} "
            f"{'lost to ring':>12} {'feed ms p50/max':>15} {'run dir MB':>10}")
    out = [head]
    for r in rows:
        growth = r["rss_growth_mb_2nd_half"]
        out.append(
            f"{r['ranks']:>5} {r['sent_per_s']:>10.0f} {r['in_per_s']:>9.0f} "
            f"{r['backlog_prof']:>7} {r['cores']:>6.2f} {r['rss0_mb']:>7.0f} "
            f"{r['peak_rss_mb']:>7.0f} {'-' if growth is None else f'{growth:.0f}':>9} "
            f"{'/'.join(_ms(v) for v in r['lat_state']):>21} "
            f"{'/'.join(_ms(v) for v in r['lat_view']):>20} "
            f"{'/'.join(_ms(v) for v in r['poll_ms']):>15} {r['sim_cores']:>9.2f} "
            f"{'/'.join(map(str, r['overwritten'])):>12} "
            f"{'/'.join(str(round(r['feed'][k] or 0)) for k in ('publish_ms_median', 'publish_ms_max')):>15} "
            f"{r['run_dir_mb']:>10.0f}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="64,256,1024")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--steps-per-s", type=float, default=4.0)
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
        print(json.dumps(collect(args, args.collect, args.summary)))
        return
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    path = _summary_file()
    size = os.path.getsize(path)
    rows = []
    try:
        for n in [int(x) for x in args.ranks.split(",")]:
            load0 = os.getloadavg()
            proc = subprocess.Popen(
                [sys.executable, HERE, "--collect", str(n), "--summary", path,
                 "--seconds", str(args.seconds), "--procs", str(args.procs),
                 "--steps-per-s", str(args.steps_per_s),
                 *(["--cprofile", f"{args.cprofile}.{n}"] if args.cprofile else [])],
                stdout=subprocess.PIPE)
            try:
                out, _ = proc.communicate(timeout=args.seconds + 300)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            row = json.loads(out.decode().strip().splitlines()[-1])
            row["load_before"], row["load_after"] = load0, os.getloadavg()
            rows.append(row)
            print(f"{n} ranks: {json.dumps(row)}", file=sys.stderr, flush=True)
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
        with contextlib.suppress(OSError):
            os.remove(path + ".lock")
    print(f"collector load: {args.seconds:.0f} s, {args.procs} simulator processes, "
          f"summary {size / 1024:.0f} KB JSON, {args.steps_per_s:g} steps/s a rank, "
          f"{os.cpu_count()} cores")
    print(table(rows))
    print("load average (1 min) before/after each run: " + ", ".join(
        f"{r['ranks']}: {r['load_before'][0]:.1f}/{r['load_after'][0]:.1f}" for r in rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
