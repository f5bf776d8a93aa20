"""Cold start (issue 10): the first result of a fresh kernel vs a warm one.

For each of ``%%torchprof``, ``%%gpumem`` and ``%ddp_check`` (2 ranks, one
all_reduce per step), ``--repeat`` fresh processes each run an IPython
``InteractiveShell``, import torch and define the cell's data (the user's own
first cell, not timed), then time from before ``%load_ext torchlens`` (which
imports torchlens) to the result's display bundle being published: the cold
figure. The same process then runs the magic again: the warm figure. Display
goes through the shell's own display publisher, replaced by one that records
the time and the bundle's MIME types, so the whole bundle (HTML + text) is
built as in a notebook.

``--gap S`` (default 2) adds a second fresh process per kind in notebook
order: ``%load_ext torchlens`` in one cell, S seconds of the user's own work
(a sleep), then the magic cell, timed alone ("first cell"): what a user
waits for when the extension was loaded in an earlier cell, as notebooks do.
``%load_ext`` starts importing the report's modules in the background
(``torchlens.frontends.shared.preload``); the immediate figure includes them.

``%ddp_check`` is also set against the bare floor of ``bench_ddp.bare``: a
fresh process (torch already imported, like the kernel) that starts two
fresh interpreters, joins them in a gloo group and runs one all_reduce. The
kinds alternate within each round so machine noise hits all of them.

Run: ``python benchmarks/bench_coldstart.py [--repeat 5] [--only torchprof,gpumem,ddp]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

SETUP = {
    "torchprof": "x = torch.randn(64, 64)",
    "gpumem": "x = torch.randn(64, 64)",
    "ddp": (
        "def step(rank, world_size):\n"
        "    import torch\n"
        "    import torch.distributed as dist\n"
        "    t = torch.ones(4)\n"
        "    dist.all_reduce(t)\n"
    ),
}
CELL = {
    "torchprof": "%%torchprof\ny = (x @ x).relu().sum()\n",
    "gpumem": "%%gpumem\ny = (x @ x).relu().sum()\n",
    "ddp": "%ddp_check step --world-size 2\n",
}

CHILD = r"""
import json, sys, time
kind, setup, cell, gap = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
import torch  # the user's first cell: not timed
from IPython.core.interactiveshell import InteractiveShell

ip = InteractiveShell.instance()
published = []


def publish(data, metadata=None, **kwargs):
    published.append((time.perf_counter(), sorted(data)))


ip.display_pub.publish = publish
ip.user_ns["torch"] = torch
assert ip.run_cell(setup).success


def run(code, load=False):
    published.clear()
    start = time.perf_counter()
    if load:
        ip.run_line_magic("load_ext", "torchlens")
    ip.run_cell(code).raise_error()
    end, mimes = published[-1]
    assert "text/html" in mimes, mimes
    return end - start


if gap:
    ip.run_line_magic("load_ext", "torchlens")
    time.sleep(gap)  # the user's next cells
    cold = run(cell)
else:
    cold = run(cell, load=True)
warm = run(cell)
print(json.dumps({"cold": cold, "warm": warm}))
"""

FLOOR = r"""
import sys, time
import torch.distributed  # the kernel has torch already
sys.path.insert(0, sys.argv[1])
from bench_ddp import bare
print(bare()[0])
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    for var in ("TORCHLENS_SERVER_URL", "TORCHLENS_SERVER_TOKEN"):
        env.pop(var, None)
    return env


def one_magic(kind: str, gap: float = 0.0) -> dict[str, float]:
    """Cold and warm seconds of one fresh process."""
    out = subprocess.run([sys.executable, "-c", CHILD, kind, SETUP[kind], CELL[kind], str(gap)],
                         capture_output=True, text=True, env=_env(), check=False,
                         timeout=300)
    if out.returncode:
        raise SystemExit(f"{kind} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def one_floor() -> float:
    out = subprocess.run([sys.executable, "-c", FLOOR, str(HERE)], capture_output=True,
                         text=True, env=_env(), check=True, timeout=300)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="fresh processes per kind")
    ap.add_argument("--only", default="torchprof,gpumem,ddp",
                    help="comma-separated kinds: torchprof, gpumem, ddp")
    ap.add_argument("--gap", type=float, default=2.0,
                    help="seconds between the %%load_ext cell and the magic cell in the "
                         "notebook-order run (0: skip it)")
    args = ap.parse_args()
    kinds = [k for k in args.only.split(",") if k]
    cold: dict[str, list[float]] = {k: [] for k in kinds}
    warm: dict[str, list[float]] = {k: [] for k in kinds}
    first: dict[str, list[float]] = {k: [] for k in kinds}
    floor: list[float] = []
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  load {os.getloadavg()[0]:.2f}  "
          f"cpus {os.cpu_count()}")
    for i in range(args.repeat):
        for kind in kinds:
            r = one_magic(kind)
            cold[kind].append(r["cold"])
            warm[kind].append(r["warm"])
            if args.gap:
                first[kind].append(one_magic(kind, args.gap)["cold"])
        if "ddp" in kinds:
            floor.append(one_floor())
        row = "  ".join(f"{k} {cold[k][-1]:.2f}/{warm[k][-1]:.2f}"
                        + (f" first cell {first[k][-1]:.2f}" if args.gap else "") for k in kinds)
        print(f"round {i + 1}: cold/warm s  {row}" + (f"  floor {floor[-1]:.2f}" if floor else ""),
              flush=True)
    med = statistics.median
    print(f"\nmedians of {args.repeat} fresh processes (s)")
    print("cold: %load_ext then the magic at once; first cell: the magic cell alone, "
          f"{args.gap:g} s after the %load_ext cell")
    print(f"{'magic':<14} {'cold':>7} {'warm':>7} {'cold/warm':>10} {'first cell':>11} "
          f"{'first/warm':>11} {'floor':>7} {'cold/floor':>11} {'first/floor':>12}")
    for kind in kinds:
        c, w = med(cold[kind]), med(warm[kind])
        f = med(first[kind]) if first[kind] else float("nan")
        extra = (f" {med(floor):>7.2f} {c / med(floor):>11.2f} {f / med(floor):>12.2f}"
                 if kind == "ddp" else "")
        name = {"ddp": "%ddp_check"}.get(kind, f"%%{kind}")
        print(f"{name:<14} {c:>7.2f} {w:>7.2f} {c / w:>10.2f} {f:>11.2f} {f / w:>11.2f}{extra}")
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
