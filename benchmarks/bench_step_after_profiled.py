"""The step after a rank's first profiled step, against its median step, under
``torchlens run``: this tree and a baseline commit interleaved (issue 23's walk).

On a machine with few cores the profiled step's summary, made on a thread of
the rank while the job goes on, takes the interpreter from the training
thread, and the step after the first profiled one paid for importing the
summariser too (walk: 3-10x its neighbours). The job: a plain 2-rank DDP loop
on gloo that never imports torchlens (Linear 32-64-4, Adam, batch 4, 10 ms of
other work a step, 60 steps, every rank even). Timed: each rank's own step
records (``steps.jsonl``): the step after the first profiled one, divided by
the rank's median training step. Each side runs in fresh ``torchlens run``
processes, alternating; the baseline is a ``git worktree`` of ``--base`` with
this tree's compiled readers copied in (a reader built from another source is
not loaded there: it then reads traces in Python, said in its output).

Run: ``python benchmarks/bench_step_after_profiled.py [--base 9164e06] [--runs 6]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = """
import time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for step in range(60):
    x, y = torch.randn(4, 32), torch.randint(0, 4, (4,))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    time.sleep(0.01)
dist.destroy_process_group()
"""


def one_run(tree: Path, job: Path) -> list[tuple[float, float, float]]:
    """(after / median, after ms, median ms) of each rank of one run."""
    out = Path(tempfile.mkdtemp(prefix="tl-after-")) / "run"
    try:
        env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
        torchrun = Path(sys.executable).with_name("torchrun")
        done = subprocess.run([sys.executable, "-m", "torchlens", "run", "--out", str(out), "--",
                               str(torchrun), "--nproc-per-node", "2", str(job)],
                              env=env, cwd=tree, capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise SystemExit(f"{tree}: torchlens run failed:\n{done.stdout[-1500:]}"
                             f"{done.stderr[-1500:]}")
        rows = []
        for r in range(2):
            recs = [json.loads(line) for line in
                    (out / f"rank{r}" / "steps.jsonl").read_text().splitlines() if line.strip()]
            ms = {x["step"]: 1e3 * (x["t1"] - x["t0"]) for x in recs
                  if not x.get("label") and not x.get("window")}
            first = min(x["step"] for x in recs if x.get("profiled"))
            mid = statistics.median(ms.values())
            rows.append((ms[first + 1] / mid, ms[first + 1], mid))
        return rows
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="9164e06", help="the baseline commit (default 9164e06, "
                    "before the summariser's imports moved to set-up)")
    ap.add_argument("--runs", type=int, default=6, help="runs per side (2 ranks each)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        job = Path(tmp) / "plain_ddp.py"
        job.write_text(JOB)
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(base),
                        args.base], check=True)
        try:
            for lib in [*REPO.glob("torchlens/formats/*/_scan_*.so"),
                        *REPO.glob("torchlens/formats/*/_snapread_*.so")]:
                shutil.copy2(lib, base / lib.relative_to(REPO))
            sides: dict[str, list[tuple[float, float, float]]] = {"this tree": [], args.base: []}
            for i in range(args.runs):
                order = [("this tree", REPO), (args.base, base)]
                for name, tree in order if i % 2 == 0 else reversed(order):
                    sides[name] += one_run(tree, job)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)],
                           check=False)
    load = os.getloadavg()[0]
    print(f"the step after the first profiled step / the rank's median step, "
          f"{args.runs} runs x 2 ranks a side (load {load:.1f})")
    med = {}
    for name, rows in sides.items():
        ratios = sorted(r for r, _, _ in rows)
        med[name] = statistics.median(ratios)
        print(f"  {name:>10}: median {med[name]:.2f}x (range {ratios[0]:.2f}-{ratios[-1]:.2f}x); "
              f"median step {statistics.median(m for _, _, m in rows):.1f} ms, the step after "
              f"{statistics.median(a for _, a, _ in rows):.1f} ms")
    print(f"  this tree / {args.base}: {med['this tree'] / med[args.base]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
