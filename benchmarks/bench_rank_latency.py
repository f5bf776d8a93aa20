"""Live latency of ``%ddp_check --profile``: a step's end on a rank -> its row streamed.

Runs a 2-rank gloo training loop (``benchmarks/ddp_jobs.py``-like, inline here)
under ``ddp_check(profile=True)`` with the real live view
(``frontends.shared.live_view.ProfiledLiveView``) built without a browser, and records,
for every step record, the time from the rank's ``t1`` (its ``torchlens.step()``
call) to the moment the view streamed that record's row into its Bokeh
source. In a notebook, jupyter_bokeh sends that stream to the browser at once;
the browser's own drawing (a few ms) is not included here. Target: under 1 s.

    .venv/bin/python benchmarks/bench_rank_latency.py [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch

import torchlens


def train(rank: int, world_size: int, steps: int = 300) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        time.sleep(0.005)
        torchlens.step()


def main() -> None:
    from torchlens.frontends.ddp import api as ddp_api
    from torchlens.frontends.shared.live_view import ProfiledLiveView

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    latencies: list[float] = []
    flush_cost: list[float] = []

    class Timed(ProfiledLiveView):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self._waiting: list[float] = []

        def push_steps(self, rank: int, records: list[Any]) -> None:
            super().push_steps(rank, records)
            self._waiting += [r.t1 for r in records]

        def flush(self, force: bool = False) -> None:
            before = self.profile.flushes
            t = time.perf_counter()
            super().flush(force)
            if self.profile.flushes != before:  # rows went out: everything pushed so far
                now = time.time()
                flush_cost.append(time.perf_counter() - t)
                latencies.extend(now - t1 for t1 in self._waiting)
                self._waiting.clear()

    ddp_api.ProfiledLiveView = Timed  # type: ignore[attr-defined]
    import torchlens.frontends.shared.live_view as live_mod

    live_mod.ProfiledLiveView = Timed  # type: ignore[misc]
    ddp_api.in_kernel = lambda: True  # the view is built as in a notebook
    import IPython.display

    IPython.display.display = lambda *a, **k: None  # no front end to send to
    from torchlens.frontends.shared import bokeh_page

    bokeh_page.load_bokehjs = lambda layouts: type("L", (), {"drop": lambda self: None})()
    with tempfile.TemporaryDirectory() as tmp:
        res = ddp_api.ddp_check(train, world_size=2, backend="gloo", profile=True,
                                steps=args.steps, run_dir=f"{tmp}/run", live=True)
    lat = sorted(latencies)
    print(f"torchlens --profile live latency, 2 gloo ranks, {args.steps} steps, "
          f"{len(lat)} step rows ({res.records.outcome})")
    print(f"  step end on a rank -> row streamed to the view: median {statistics.median(lat):.3f} s,"
          f" p95 {lat[int(0.95 * (len(lat) - 1))]:.3f} s, max {lat[-1]:.3f} s (target < 1 s)")
    print(f"  view flush (all panels, kernel side): median {1e3 * statistics.median(flush_cost):.1f} ms")


if __name__ == "__main__":
    main()
