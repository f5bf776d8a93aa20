"""A warm ``%%torchprof`` cell at this tree against a pinned baseline commit (issue 26).

The cell: 8 ``nn.Linear(256, 256)`` layers, 10 forward/backward steps with
``torchlens.step()``, its report built and published as in a notebook (an
IPython ``InteractiveShell`` whose display publisher keeps the bundle). Each
side runs in fresh processes, alternating A/B so machine noise hits both; a
process runs the cell ``--cells`` times and the first (cold) run is dropped.
Timed: the whole ``run_cell`` (capture, analysis, report, display), wall and
process CPU. Imports and the model's construction are outside the timer on
both sides.

The baseline is checked out with ``git worktree`` into a temporary folder
(its C scanner is not built there: ``TORCHLENS_NO_NATIVE=1`` on both sides so
both read the trace with the Python reader). Prints each side's median and
the ratio; exits 1 when this tree's median wall time is more than ``--max``
(1.5) times the baseline's: a comparison, not a timed test, so the machine's
speed cancels out.

Run: ``python benchmarks/check_warm_cell.py [--base 8cc97e2] [--runs 4] [--cells 6]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, statistics, sys, time
import torch
from IPython.core.displaypub import DisplayPublisher
from IPython.core.interactiveshell import InteractiveShell

ip = InteractiveShell.instance()
ip.run_cell("%load_ext torchlens")
ip.run_cell('''
import torch, torchlens
model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
x = torch.randn(64, 256)
''')
shown = []


class Publisher(DisplayPublisher):
    def publish(self, data, metadata=None, **kw):
        shown.append(sorted(data))


ip.display_pub = Publisher()
cell = '''%%torchprof
for _ in range(10):
    model(x).sum().backward()
    torchlens.step()
'''
wall, cpu = [], []
for _ in range(int(sys.argv[1])):
    w, c = time.perf_counter(), time.process_time()
    result = ip.run_cell(cell)
    wall.append(time.perf_counter() - w)
    cpu.append(time.process_time() - c)
    assert result.success, result.error_in_exec
assert shown and "text/html" in shown[-1], shown
print(json.dumps({"wall": statistics.median(wall[1:]), "cpu": statistics.median(cpu[1:])}))
"""


def measure(tree: Path, cells: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "TORCHLENS_NO_NATIVE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(cells)], cwd=tempfile.gettempdir(),
                          env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: the cell failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="8cc97e2", help="the baseline commit (default 8cc97e2)")
    ap.add_argument("--runs", type=int, default=4, help="fresh processes per side")
    ap.add_argument("--cells", type=int, default=6, help="cells per process (the first dropped)")
    ap.add_argument("--max", type=float, default=1.5, help="fail above this ratio")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(base),
                        args.base], check=True)
        try:
            sides: dict[str, list[dict[str, float]]] = {"this tree": [], args.base: []}
            for i in range(args.runs):
                order = [("this tree", REPO), (args.base, base)]
                for name, tree in order if i % 2 == 0 else reversed(order):
                    sides[name].append(measure(tree, args.cells))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)],
                           check=False)
    med = {name: {k: statistics.median(r[k] for r in runs) for k in ("wall", "cpu")}
           for name, runs in sides.items()}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"warm %%torchprof cell, median of {args.runs} processes x {args.cells - 1} warm cells "
          f"(load {load:.1f})")
    for name, m in med.items():
        print(f"  {name:>12}: wall {m['wall'] * 1e3:7.1f} ms   cpu {m['cpu'] * 1e3:7.1f} ms")
    ratio = med["this tree"]["wall"] / med[args.base]["wall"]
    print(f"  ratio this tree / {args.base}: {ratio:.2f}x (fail above {args.max}x)")
    return 1 if ratio > args.max else 0


if __name__ == "__main__":
    raise SystemExit(main())
