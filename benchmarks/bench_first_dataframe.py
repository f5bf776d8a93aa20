"""What a script's first DataFrame costs (issue 26: "decide whether a user's first
``result.ops()`` should pay 0.34 s for pandas, and measure it").

torchlens imports pandas only when a DataFrame is asked for: ``torchlens report``,
``torchlens analyze --json`` and every HTML report never import it, and
``%load_ext torchlens`` imports it on a background thread (``frontends.shared.preload``)
while the user writes the next cell. So the one place a user waits for it is the
first DataFrame of a plain script. This prints, in fresh processes (median of
``--repeat``): ``torchlens.load(TRACE)`` alone, its first ``ops()`` (pandas
imported inside it), the second ``ops()``, and ``import pandas`` timed alone in
another fresh process; and whether the two commands import pandas at all.

Run: ``PYTHONPATH=. .venv/bin/python benchmarks/bench_first_dataframe.py [--repeat 5]``
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

import paths

REPO = paths.REPO
TRACE = paths.traces() / "a100_simple_add.json.gz"

_CHILD = """
import json, sys, time
import torchlens
t0 = time.perf_counter(); run = torchlens.load(sys.argv[1]); t1 = time.perf_counter()
had = "pandas" in sys.modules
run.ops(); t2 = time.perf_counter(); run.ops(); t3 = time.perf_counter()
print(json.dumps({"load": t1 - t0, "first": t2 - t1, "second": t3 - t2, "had": had}))
"""
_PANDAS = "import time; t = time.perf_counter(); import pandas; print(time.perf_counter() - t)"


def _py(code: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          check=True, env=env).stdout.strip().splitlines()[-1]


def _imports_pandas(*cmd: str) -> bool:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    got = subprocess.run([sys.executable, "-X", "importtime", "-m", "torchlens", *cmd],
                         capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    return any(line.rstrip().endswith("| pandas") for line in got.stderr.splitlines())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--trace", default=str(TRACE))
    a = p.parse_args()
    runs = [json.loads(_py(_CHILD, a.trace)) for _ in range(a.repeat)]
    pandas = [float(_py(_PANDAS)) for _ in range(a.repeat)]
    med = {k: statistics.median(r[k] for r in runs) for k in ("load", "first", "second")}
    print(f"trace {Path(a.trace).name}, median of {a.repeat} fresh processes, load "
          f"{os.getloadavg()[0]:.1f}")
    print(f"  torchlens.load(TRACE)        {med['load']:.3f} s")
    print(f"  first run.ops()              {med['first']:.3f} s  (pandas imported before: "
          f"{any(r['had'] for r in runs)})")
    print(f"  second run.ops()             {med['second'] * 1000:.2f} ms")
    print(f"  import pandas alone          {statistics.median(pandas):.3f} s")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench_first_dataframe.html")
        print(f"  torchlens report imports pandas: {_imports_pandas('report', a.trace, '-o', out)}")
    print(f"  torchlens analyze --json imports pandas: "
          f"{_imports_pandas('analyze', a.trace, '--json')}")


if __name__ == "__main__":
    main()
