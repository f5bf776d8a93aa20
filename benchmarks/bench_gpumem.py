"""%%gpumem CPU-path overhead: the same cell of training steps under the magic vs plain.

Timed inside the cell (the magic's start/stop and the report are outside the
measured body, as for %%torchprof), in a real IPython shell. Rounds alternate
so machine noise hits both; round 0 is a warm-up (the first profiled run of a
process is much slower). Also reports the stacks-off variant (``--stacks 0``:
profiler [memory] events only) to show what the per-op stack capture costs,
and the time from the cell's end to the display bundle.

Run: .venv/bin/python benchmarks/bench_gpumem.py
"""

from __future__ import annotations

import statistics
import time

import torch
from IPython.core.interactiveshell import InteractiveShell
from torch import nn

torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10))
OPT = torch.optim.SGD(MODEL.parameters(), lr=0.01, momentum=0.9)
X, Y = torch.randn(64, 512), torch.randint(0, 10, (64,))


def body(steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        OPT.zero_grad()
        nn.functional.cross_entropy(MODEL(X), Y).backward()
        OPT.step()
    return time.perf_counter() - t0


def overhead(rounds: int = 7, steps: int = 100) -> dict[str, float]:
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext torchlens")
    shell.user_ns.update(body=body, steps=steps)
    cells = {"plain": "_t = body(steps)",
             "gpumem": "%%gpumem --quiet -o _r\n_t = body(steps)",
             "gpumem --stacks 0": "%%gpumem --quiet --stacks 0 -o _r\n_t = body(steps)"}
    times: dict[str, list[float]] = {k: [] for k in cells}
    report: list[float] = []
    for i in range(rounds + 1):
        for name, cell in cells.items():
            assert shell.run_cell(cell).success
            if i:
                times[name].append(shell.user_ns["_t"])
        if i:
            t0 = time.perf_counter()
            shell.user_ns["_r"]._repr_mimebundle_()
            report.append(time.perf_counter() - t0)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["report_s"] = statistics.median(report)
    out["allocs"] = len(shell.user_ns["_r"].analysis().timeline.allocations)
    return out


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    r = overhead()
    print("\nOverhead: cell of 100 train steps (MLP 512-512-512-10, batch 64), median of 7 rounds")
    print(f"  plain                 {r['plain'] * 1e3:8.1f} ms")
    for name in ("gpumem", "gpumem --stacks 0"):
        print(f"  %%{name:<19} {r[name] * 1e3:8.1f} ms   ratio {r[name] / r['plain']:.3f}x"
              "   (target <= 1.3x)")
    print(f"\nDisplay bundle (HTML + text) after the cell: {r['report_s']:.2f} s "
          f"({r['allocs']:,} allocations)")


if __name__ == "__main__":
    main()
