"""What ``torchlens run --metrics`` costs at many ranks (issue 25: cardinality).

N simulated CUDA ranks (every family present: allocator figures, fragmentation,
largest free block), each with the collector's ``KEEP_STEPS`` newest step
records and a straggler; their step histograms filled with ``--steps`` steps.
Measured:

- series: samples in one scrape (lines not starting with ``#``) and its bytes;
- scrape: ``metric_families`` + ``exposition``, what the endpoint's thread does
  per request (the ``RunView`` is the loop's, already computed);
- tick: what the histograms pay each poll (``StepHistograms.add`` of every
  slot's new batch, 3 records each).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_metrics_scrape.py [--ranks 64,256,1024]
"""

from __future__ import annotations

import argparse
import time
from statistics import median
from typing import Any

from torchlens.analysis.ranks.metrics import StepHistograms, metric_families
from torchlens.analysis.ranks.verdict import run_view
from torchlens.model.records import StepRecord
from torchlens.render.metrics_text import exposition

KEEP_STEPS = 64  # capture.ranks.collector.KEEP_STEPS (benchmarks read no capture internals)


def _record(rank: int, step: int) -> StepRecord:
    t0 = step * 0.1
    data = 0.04 if rank == 1 else 0.001
    return StepRecord.from_dict({
        "step": step, "t0": t0, "t1": t0 + 0.1,
        "phases": {"data": data, "forward": 0.012, "backward": 0.06 - data,
                   "optimizer": 0.004, "collective": 0.0},
        "mem": {"rss": 4 << 30, "allocated": (20 << 30) + step, "reserved": 30 << 30,
                "inactive_split": 1 << 30, "largest_free": 1 << 29, "source": "cuda"}})


def measure(n: int, steps: int, repeat: int) -> dict[str, Any]:
    records = [[_record(r, s) for s in range(KEEP_STEPS)] for r in range(n)]
    ranks = [{"rank": r, "node": r // 8, "host": f"gpu-node-{r // 8:04d}", "silent_s": 0.3,
              "bye": None, "heartbeat": {"steps_done": KEEP_STEPS}, "steps_sent": steps,
              "shared_run_dir": True, "incarnation": 0} for r in range(n)]
    view = run_view({"world_size": n, "ranks": ranks, "steps": records,
                     "summaries": [[] for _ in range(n)], "dropped": 0, "lost_after_s": 10.0})
    hist = StepHistograms()
    for r in range(n):
        hist.add(r, records[r])  # the kept ones
        hist.ranks[r] = hist.ranks[r].add([0.1] * (steps - KEEP_STEPS))
    ages = {r: 0.3 for r in range(n)}
    scrape, body = [], ""
    for _ in range(repeat):
        t = time.perf_counter()
        body = exposition(metric_families(view, "exp1", dict(hist.ranks), ages))
        scrape.append(time.perf_counter() - t)
    ticks = []
    for _ in range(repeat):
        t = time.perf_counter()
        for r in range(n):
            hist.add(r, records[r][-3:])
        ticks.append(time.perf_counter() - t)
    series = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    return {"ranks": n, "series": series, "per_rank": series / n, "bytes": len(body.encode()),
            "scrape_ms": 1e3 * median(scrape), "scrape_max_ms": 1e3 * max(scrape),
            "tick_ms": 1e3 * median(ticks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="64,256,1024")
    parser.add_argument("--steps", type=int, default=10_000, help="steps per rank so far")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    print("ranks  series  per rank  scrape bytes  scrape ms (p50 / max)  loop tick ms")
    for n in map(int, args.ranks.split(",")):
        m = measure(n, args.steps, args.repeat)
        print(f"{m['ranks']:5d}  {m['series']:6d}  {m['per_rank']:8.1f}  {m['bytes']:12,d}  "
              f"{m['scrape_ms']:8.1f} / {m['scrape_max_ms']:6.1f}        {m['tick_ms']:8.2f}")


if __name__ == "__main__":
    main()
