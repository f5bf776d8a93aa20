"""How often an even multi-rank CPU run has a rank named as a slow rank.

Runs ``make_gloo_run.py`` ``--runs`` times with no deliberate slow rank and
counts the runs whose findings say a rank "arrived last" (the rule:
``analysis.runs.slow_ranks``). Two setups side by side: ranks that
only compute (4 ranks on this 2-core machine: the scheduler really holds
one back) and ranks that each also load data for ``--base-ms`` (the even
run ``tests/runs/test_gloo_run.py`` uses).

    python benchmarks/check_even_runs.py --runs 20
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from torchlens.frontends.runs.api import load_run

HERE = Path(__file__).resolve().parent


def named(ranks: int, steps: int, base_ms: float) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        subprocess.run([sys.executable, str(HERE / "make_gloo_run.py"), str(out),
                        "--ranks", str(ranks), "--slow-rank", "-1", "--steps", str(steps),
                        "--base-ms", str(base_ms)], check=True, capture_output=True)
        return [f for f in load_run(str(out), workers=2).findings() if "arrived last" in f]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--setups", default="4:0,8:20",
                   help="steps:base_ms pairs, comma separated")
    a = p.parse_args()
    for setup in a.setups.split(","):
        steps, base = setup.split(":")
        hits = [named(a.ranks, int(steps), float(base)) for _ in range(a.runs)]
        n = sum(bool(h) for h in hits)
        print(f"{a.ranks} ranks, {steps} steps, every rank loading {base} ms a step: "
              f"{n} of {a.runs} runs named a slow rank", flush=True)
        for h in hits:
            if h:
                print(f"  {h[0][:150]}", flush=True)


if __name__ == "__main__":
    main()
