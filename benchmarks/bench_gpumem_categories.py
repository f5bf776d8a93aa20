"""What ``%%gpumem --categories torch`` costs: whole-cell wall time (capture, body,
stop, torch's memory profile, analysis and the display bundle) of the same cell of
training steps, plain, under ``%%gpumem`` and under ``%%gpumem --categories torch``.

Rounds alternate so machine noise hits every variant; round 0 is a warm-up. The
figure that decides the default: torch's categories need the full profiler (every
aten op observed with shapes and the Python tracer) and ``_memory_profile()``'s
pure-Python replay of the op graph, where the default capture observes no op.

Run: .venv/bin/python benchmarks/bench_gpumem_categories.py [--rounds N] [--steps N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from IPython.core.interactiveshell import InteractiveShell

SETUP = """
import torch
from torch import nn
torch.manual_seed(0)
bench_model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                            nn.Linear(512, 10))
bench_opt = torch.optim.Adam(bench_model.parameters())
bench_x, bench_y = torch.randn(64, 512), torch.randint(0, 10, (64,))
def bench_body(steps):
    for _ in range(steps):
        bench_opt.zero_grad()
        nn.functional.cross_entropy(bench_model(bench_x), bench_y).backward()
        bench_opt.step()
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    shell = InteractiveShell.instance()
    assert shell.run_cell("%load_ext torchlens").success
    assert shell.run_cell(SETUP).success
    body = f"bench_body({args.steps})"
    cells = {"plain": body,
             "%%gpumem": f"%%gpumem --quiet -o _r\n{body}",
             "%%gpumem --categories torch": f"%%gpumem --quiet --categories torch -o _r\n{body}"}
    times: dict[str, list[float]] = {k: [] for k in cells}
    # the cell's body under the capture, and the capture's stop (torch's replay is there)
    parts: dict[str, list[tuple[float, float]]] = {k: [] for k in cells}
    for i in range(args.rounds + 1):
        for name, cell in cells.items():
            t0 = time.perf_counter()
            assert shell.run_cell(cell).success
            if name != "plain":
                shell.user_ns["_r"]._repr_mimebundle_()  # the analysis and the report
            if i:
                times[name].append(time.perf_counter() - t0)
                if name != "plain":
                    p = shell.user_ns["_r"].profile
                    parts[name].append((p.wall_time_s, p.payload.capture_stop_s))
    print(f"torch {torch.__version__}, {args.steps} Adam steps of a 512-wide MLP per cell, "
          f"{args.rounds} rounds, median (min..max) seconds per cell incl. the report")
    base = statistics.median(times["plain"])
    for name, ts in times.items():
        m = statistics.median(ts)
        split = ""
        if parts[name]:
            split = (f"  body {statistics.median(b for b, _ in parts[name]):.3f}, stop "
                     f"{statistics.median(s for _, s in parts[name]):.3f}")
        print(f"  {name:<30} {m:7.3f}  ({min(ts):.3f}..{max(ts):.3f})  {m / base:5.1f}x plain"
              + split)


if __name__ == "__main__":
    main()
