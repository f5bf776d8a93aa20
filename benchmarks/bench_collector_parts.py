"""Two costs inside the ``torchlens run`` collector's loop, measured apart (issue 14, scale).

- ``multi_get`` of N values of a summary's size from the collector's own
  TCPStore: in one call, against calls of ``collector.CHUNK`` keys (why the
  collector reads in chunks).
- One frame of the live summary at N ranks: ``run_view`` over a snapshot of
  N ranks holding ``collector.KEEP_STEPS`` step records each (shaped as
  ``bench_collector_load``'s ranks send them), against the same with 256
  records (the window before it was cut).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_collector_parts.py [--ranks 1024] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta

from bench_collector_load import _record


def multi_get_s(n: int, size: int, chunk: int | None, repeat: int) -> float:
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60),
                           wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False,
                           timeout=timedelta(seconds=60))
    keys = [f"v/{i}" for i in range(n)]
    value = os.urandom(size)
    for k in keys:
        client.set(k, value)
    step = chunk or n
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        for i in range(0, n, step):
            server.multi_get(keys[i:i + step])  # the collector reads through the server's store
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def view_s(n: int, records: int, repeat: int) -> float:
    from torchlens.analysis.ranks.verdict import run_view
    from torchlens.model.records import StepRecord

    steps = [[StepRecord.from_dict(_record(i, i * 0.25, i * 0.25 + 0.25)) for i in range(records)]
             for _ in range(n)]
    ranks = [{"rank": r, "node": r // 8, "host": f"node{r // 8}", "silent_s": 0.1, "bye": None,
              "heartbeat": {"steps_done": records}, "steps_sent": records,
              "shared_run_dir": True} for r in range(n)]
    summaries = [[{"step": i, "memory": {}} for i in range(16)] for _ in range(n)]
    snap = {"world_size": n, "ranks": ranks, "steps": steps, "summaries": summaries,
            "dropped": 0, "restarts": [], "lost_after_s": 10.0}
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        run_view(snap)
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--size", type=int, default=54 * 1024, help="bytes per value")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from torchlens.capture.ranks.collector import CHUNK, KEEP_STEPS

    n = args.ranks
    whole = multi_get_s(n, args.size, None, args.repeat)
    chunked = multi_get_s(n, args.size, CHUNK, args.repeat)
    print(f"multi_get of {n} values of {args.size // 1024} KB: one call {whole:.3f} s, "
          f"calls of {CHUNK} {chunked:.3f} s ({whole / chunked:.1f}x), median of {args.repeat}")
    kept = view_s(n, KEEP_STEPS, args.repeat)
    before = view_s(n, 256, args.repeat)
    print(f"run_view at {n} ranks: {KEEP_STEPS} records a rank {kept:.3f} s, "
          f"256 records a rank {before:.3f} s, median of {args.repeat}")


if __name__ == "__main__":
    main()
