"""What publishing ``torchlens run``'s live feed costs the collector's loop (issue 14, watch).

The real ``Collector`` (its store, its spool-less memory) holding N simulated
ranks, each at the collector's limits (``KEEP_STEPS`` step records and
``KEEP_SUMMARIES`` cut summaries kept); every simulated second each rank
adds ``--steps-per-s`` step records (shaped as a real CPU rank's), a new
heartbeat, and every other rank a cut summary, as ``Collector._read_values``
would after a poll. Then the loop's work for one frame, timed apart:

- ``run_view`` + ``live_status``: the verdict and rows, when
  ``FeedPublisher.status_due`` says so (``run_view`` is paid anyway once a
  second when the summary draws on a terminal; here nothing draws);
- ``publish``: building the frame (only what is new), encoding it once,
  appending it to ``live.jsonl``, replacing ``live.json`` and setting it,
  sealed, in the store (and deleting the frame ``KEEP_FRAMES`` older).

No rank processes: the poll itself is measured by bench_collector_load.py.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_live_feed.py [--ranks 64,256,1024] [--frames 30]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from statistics import median
from typing import Any

from bench_collector_load import _record as rank_record

from torchlens.model.messages import Heartbeat, Hello
from torchlens.model.records import StepRecord


def _record(step: int, t0: float) -> StepRecord:
    """A 100 ms step, shaped as the collector load benchmark's ranks send it."""
    return StepRecord.from_dict(rank_record(step, t0, t0 + 0.1))


def _summary(rank: int, step: int, t0: float) -> dict[str, Any]:
    """A summary as the collector keeps it (``SUMMARY_KEYS`` only)."""
    return {"rank": rank, "step": step, "trace": f"rank{rank}/step{step:05d}.pt.trace.json",
            "t0": t0, "t1": t0 + 0.1, "step_ms": 98.2,
            "breakdown": {"kernel_us": 0, "memcpy_us": 0, "memset_us": 0, "runtime_us": 0,
                          "dataloader_us": 31000, "cpu_exec_us": 61000, "other_us": 6200,
                          "comm_us": 0},
            "memory": {"allocated": 1 << 20, "reserved": 2 << 20, "inactive_split": 4096,
                       "largest_free": 1 << 19, "peak_allocated": 3 << 20,
                       "source": "modelled"},
            "events": 15234, "bytes": 23012}


def measure(n: int, frames: int, steps_per_s: int) -> dict[str, Any]:
    from torchlens.analysis.ranks.verdict import live_status, run_view
    from torchlens.capture.channel.signing import RunKey
    from torchlens.capture.ranks.collector import (
        KEEP_STEPS,
        KEEP_SUMMARIES,
        Collector,
        Slot,
    )
    from torchlens.capture.ranks.feed import FeedPublisher

    out = tempfile.mkdtemp(prefix="bench-live-feed-")
    c = Collector(RunKey.new())
    feed = FeedPublisher(c, out)
    t = time.time() - KEEP_STEPS * 0.1
    for r in range(n):
        s = Slot(r, Hello(rank=r, world_size=n, node=r // 8, host=f"sim-node{r // 8}", pid=1,
                          restart=0, t=t, shared_run_dir=True), time.monotonic())
        s.steps = [_record(i, t + i * 0.1) for i in range(KEEP_STEPS)]
        s.summaries = [_summary(r, i * 10, t + i) for i in range(KEEP_SUMMARIES)]
        s.counts = [KEEP_STEPS, KEEP_SUMMARIES]
        s.heartbeat = Heartbeat(t=time.time(), beat=1, rss=412_000_000, steps_done=KEEP_STEPS)
        c.slots[r] = s
        for fn in c.listeners:  # the backlog, handed on as Collector._take does
            fn(s, 0, s.steps)
            fn(s, 1, s.summaries)
    feed.publish(live_status(run_view(c.snapshot())))  # the backlog: not what a frame costs
    feed.thinned = 0
    last_view_s = 0.0
    view_s, status_s, publish_s, sizes = [], [], [], []
    for k in range(frames):
        for s in c.slots.values():  # one second of a rank, as a poll leaves it
            step = s.counts[0]
            new = [_record(step + i, t + (step + i) * 0.1) for i in range(steps_per_s)]
            s.steps += new
            del s.steps[:-KEEP_STEPS]
            s.counts[0] += steps_per_s
            kept = [(0, new)]
            if (s.slot + k) % 2 == 0:
                s.summaries.append(_summary(s.rank, step, t + step * 0.1))
                del s.summaries[:-KEEP_SUMMARIES]
                s.counts[1] += 1
                kept.append((1, s.summaries[-1:]))
            for kind, values in kept:  # handed on as Collector._take does
                for fn in c.listeners:
                    fn(s, kind, values)
            s.heartbeat = Heartbeat(t=time.time(), beat=k + 2, rss=412_000_000,
                                    steps_done=s.counts[0])
            s.seen = time.monotonic()
        status = None
        if feed.status_due(last_view_s):  # as frontends.ranks.command.watch does (no terminal drawing)
            t0 = time.perf_counter()
            view = run_view(c.snapshot())
            t1 = time.perf_counter()
            status = live_status(view)
            last_view_s = t1 - t0
            view_s.append(t1 - t0)
            status_s.append(time.perf_counter() - t1)
        before = feed.bytes
        t2 = time.perf_counter()
        feed.publish(status)
        publish_s.append(time.perf_counter() - t2)
        sizes.append(feed.bytes - before)
        time.sleep(1.0)  # the loop's cadence: the status refresh is paced by the clock
    feed.close()
    c.close()
    feed_mb = os.path.getsize(os.path.join(out, "live.jsonl")) / 1e6
    status_kb = os.path.getsize(os.path.join(out, "live.json")) / 1e3

    def ms(values: list[float]) -> dict[str, float]:
        values = sorted(values)
        return {"p50": round(median(values) * 1e3, 2),
                "p95": round(values[int(0.95 * (len(values) - 1))] * 1e3, 2),
                "max": round(values[-1] * 1e3, 2)}

    return {"ranks": n, "frames": frames, "steps_per_s": steps_per_s,
            "run_view_ms": ms(view_s), "status_refreshes": len(view_s),
            "live_status_ms": ms(status_s), "publish_ms": ms(publish_s),
            "store_thinned": feed.thinned, "frame_kb_p50": round(median(sizes) / 1e3, 1),
            "live_jsonl_mb": round(feed_mb, 2), "live_json_kb": round(status_kb, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--steps-per-s", type=int, default=10)
    args = ap.parse_args()
    for n in (int(x) for x in args.ranks.split(",")):
        print(json.dumps(measure(n, args.frames, args.steps_per_s)), flush=True)


if __name__ == "__main__":
    main()
