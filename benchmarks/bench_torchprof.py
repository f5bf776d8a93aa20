"""%%torchprof overhead and result latency, side by side with bare torch.profiler.

Overhead: the same cell of small training steps, timed inside the cell, under
``%%torchprof`` (a real IPython shell) and under a bare
``torch.profiler.profile`` with the same options. Rounds alternate so machine
noise hits both; the first profiled run of a process is discarded (warm-up).

Latency: a cell with about 100k profiler events; time from the cell's end to
the display bundle (HTML + text) being ready, vs ``prof.key_averages().table()``
on the same kind of profile.

One torch thread on both sides by default (``--threads N`` to change): with two
threads on a 2-core machine another process's work stalls torch's thread pool,
and the same 300 steps took 0.3 to 2.2 s round to round on either side.

Run: .venv/bin/python benchmarks/bench_torchprof.py [--threads 1]
"""

from __future__ import annotations

import statistics
import time

import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

import torchlens
from torchlens.capture.trace.profiler import (
    ProfilerCapture,
    ProfilerOptions,
    _record_always,
)
from torchlens.frontends.kinds import display_bundle

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
OPT = torch.optim.SGD(MODEL.parameters(), lr=0.01)
X, Y = torch.randn(32, 128), torch.randint(0, 10, (32,))


#: How a step is marked: torchlens.step() under %%torchprof; the bare profiler's
#: own prof.step() on the other side, so both mark the same steps.
STEP = [torchlens.step]


def train_step() -> None:
    OPT.zero_grad()
    nn.functional.cross_entropy(MODEL(X), Y).backward()
    OPT.step()
    STEP[0]()


def body(steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step()
    return time.perf_counter() - t0


def overhead(rounds: int = 15, steps: int = 300) -> tuple[float, float]:
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext torchlens")
    shell.user_ns.update(body=body, steps=steps)
    ours, bare = [], []
    for i in range(rounds + 1):
        shell.run_cell("%%torchprof --quiet\n_t = body(steps)")
        t_ours = shell.user_ns["_t"]
        # same options as the magic: CPU activity, steps marked (ProfilerStep#N)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    schedule=_record_always) as prof:
            STEP[0] = prof.step
            t_bare = body(steps)
        STEP[0] = torchlens.step
        if i:  # round 0 is the warm-up
            ours.append(t_ours)
            bare.append(t_bare)
    return statistics.median(ours), statistics.median(bare)


def latency(steps: int = 800, rounds: int = 3) -> tuple[int, float, float]:
    """Median over ``rounds`` alternating rounds of each side."""
    ours, peer = [], []
    for _ in range(rounds):
        n_events, stages = _latency_ours(steps)
        STAGES.append(stages)
        ours.append(sum(stages.values()))
        peer.append(_latency_peer(steps))
    return n_events, statistics.median(ours), statistics.median(peer)


#: Per-stage seconds of each of our latency rounds (printed as medians).
STAGES: list[dict[str, float]] = []


def _latency_ours(steps: int) -> tuple[int, dict[str, float]]:
    cap = ProfilerCapture(ProfilerOptions())
    with cap:
        body(steps)
    profile = cap.profile
    assert profile is not None
    t = profile.payload.timings
    t0 = time.perf_counter()
    display_bundle(profile)
    stages = {"stop": t["stop_s"], "export": t["export_s"], "ingest": t["ingest_s"],
              "analysis+render": time.perf_counter() - t0}
    return len(profile.trace.events), stages


def _latency_peer(steps: int) -> float:
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.__enter__()
    body(steps)
    t0 = time.perf_counter()  # the cell's end: both sides pay the profiler's stop
    prof.__exit__(None, None, None)
    prof.key_averages().table(sort_by="cpu_time_total", row_limit=20)
    return time.perf_counter() - t0


def main() -> None:
    import argparse

    from torchlens.formats.kineto import native_available as available

    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    torch.set_num_threads(p.parse_args().threads)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"C trace scanner: {available()}")
    ours, bare = overhead()
    print("\nOverhead: cell of 300 small train steps, median of 15 rounds")
    print(f"  %%torchprof            {ours * 1e3:8.1f} ms")
    print(f"  bare torch.profiler    {bare * 1e3:8.1f} ms")
    print(f"  ratio                  {ours / bare:8.3f}x   (target <= 1.05x)")
    n, ours_l, peer_l = latency()
    print(f"\nResult latency: cell with {n:,} profiler events, median of 3 rounds")
    print(f"  torchlens (stop+export+ingest+render) {ours_l:6.2f} s")
    for stage in STAGES[0]:
        print(f"    {stage:<20} {statistics.median(s[stage] for s in STAGES):6.2f} s")
    print(f"  key_averages().table()                {peer_l:6.2f} s")
    print(f"  speed-up                              {peer_l / ours_l:6.1f}x "
          "  (target >= 5x and < 1.5 s)")


if __name__ == "__main__":
    main()
