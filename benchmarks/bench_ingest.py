"""Trace ingest: torchlens vs HolisticTraceAnalysis on every shared trace (issue 2).

torchlens is timed twice: with its C scanner (the default when it was built)
and with the Python reader alone (``TORCHLENS_NO_NATIVE=1``, what a machine
without a C compiler gets). Each side runs in its own fresh subprocess per trace, so peak memory
(``ru_maxrss``) is that side's alone. Timed: parse the file and build an op
table (torchlens: ``load_trace`` + ``op_table``; HTA: ``TraceAnalysis`` on a
folder holding just that trace, then a per-name groupby of its events, the
nearest HTA equivalent). Imports are outside both timers: pandas too, which
HTA imports with its module and torchlens's ``op_table`` imports on first use
(about 0.34 s and 37 MB here, which a timer around only torchlens would
count; issue 26). Memory is shown as peak RSS and as growth over the RSS
after imports.

The sides alternate within each repeat (torchlens, its Python reader, HTA;
then again), so a machine that slows down or speeds up part-way hits every
side alike; each side's best run is shown. A side that runs past
``--timeout`` is said as such ("timed out after N s"), with the peak memory
it had reached when it was stopped.

Run with the peers' venv (``scripts/bench-env``), which has HTA:
``PYTHONPATH=. .bench-venv/bin/python benchmarks/bench_ingest.py [--repeat N]``;
the traces are ``benchmarks/paths.py``'s (``$TORCHLENS_TESTDATA``), or the
files given with ``--trace`` (a big one from ``benchmarks/make_big_trace.py``:
``--sides torchlens hta --repeat 1 --timeout 600``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import paths

REPO = paths.REPO
TRACES = paths.traces()

_CHILD = r"""
import gc, json, resource, sys, time, logging
side, path, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
logging.disable(logging.CRITICAL)
if side.startswith("torchlens"):
    import pandas  # noqa: F401 - op_table imports it lazily; HTA's is imported before its timer too
    from torchlens.formats.kineto import load_trace
    from torchlens.analysis.trace.ops import op_table
    def run():
        return len(op_table(load_trace(path)))
else:
    import shutil, os, warnings
    warnings.filterwarnings("ignore")
    from hta.trace_analysis import TraceAnalysis
    folder = os.path.join(tmp, "rank_traces")
    os.makedirs(folder, exist_ok=True)
    gz = open(path, "rb").read(2) == b"\x1f\x8b"  # HTA reads by the name's suffix
    shutil.copy(path, os.path.join(folder, "rank-0.json.gz" if gz else "rank-0.json"))
    def run():
        ta = TraceAnalysis(trace_dir=folder)
        df = ta.t.get_trace(next(iter(ta.t.traces)))
        names = ta.t.symbol_table.get_sym_table()
        table = df.groupby("name")["dur"].agg(["count", "sum"])
        return len(table) if names is not None else -1
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
rows = run()
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"s": dt, "peak_mb": peak / 1024, "base_mb": base / 1024, "rows": rows}))
"""


def measure(side: str, trace: Path, timeout: float = 900) -> dict:
    """Time and memory of one fresh process; a run past ``timeout`` is stopped
    and said as such, with the peak RSS it had reached (``/proc``'s VmHWM)."""
    env = dict(os.environ)
    env.pop("TORCHLENS_NO_NATIVE", None)
    if side == "torchlens-py":
        env["TORCHLENS_NO_NATIVE"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, side, str(trace), tmp],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            peak = _vm_hwm_mb(proc.pid)
            proc.kill()
            proc.communicate()
            return {"error": f"timed out after {timeout:.0f} s",
                    "peak_mb": peak, "timed_out": True}
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["?"])[-1]
        return {"error": last[:80]}
    return json.loads(out.strip().splitlines()[-1])


def _vm_hwm_mb(pid: int) -> float | None:
    """A live process's peak RSS so far, in MB (Linux ``/proc``), else None."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


SIDES = ("torchlens", "torchlens-py", "hta")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--trace", nargs="*", help="trace files to read (default: every "
                        "shared trace)")
    parser.add_argument("--sides", nargs="*", default=list(SIDES), choices=SIDES,
                        help="which readers to time")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds one side may take on one trace before it is stopped")
    args = parser.parse_args()
    from torchlens.formats.kineto import native_available as available

    print(f"C scanner built: {available()}")
    files = ([Path(p) for p in args.trace] if args.trace
             else sorted(p for p in TRACES.glob("*.json.gz")))
    sides = tuple(args.sides)
    if args.trace and "hta" in sides:
        print("(HTA reads a copy of each trace in a temporary folder: the disk needs room "
              "for one more copy)")
    print(f"{'trace':40} {'MB':>5} | {'TL s':>7} {'TL-py s':>8} {'HTA s':>7} "
          f"{'x vs HTA':>8} {'py/C':>5} | {'TL peak/+MB':>12} {'HTA peak/+MB':>13}")
    total = dict.fromkeys(sides, 0.0)
    for trace in files:
        runs: dict[str, list[dict]] = {s: [] for s in sides}
        for _ in range(args.repeat):  # alternating: each repeat runs every side once
            for side in sides:
                runs[side].append(measure(side, trace, args.timeout))
        best: dict[str, dict] = {}
        for side in sides:
            ok = [r for r in runs[side] if "error" not in r]
            best[side] = min(ok, key=lambda r: r["s"]) if ok else runs[side][0]
        size = trace.stat().st_size / 1e6
        if set(sides) != set(SIDES) or any("error" in r for r in best.values()):
            print(f"{trace.name:40} {size:5.2f} | " + " | ".join(
                f"{s}: " + (f"{best[s]['s']:.2f} s, peak {best[s]['peak_mb']:,.0f} MB"
                            if "error" not in best[s] else best[s]["error"]
                            + (f", peak at least {best[s]['peak_mb']:,.0f} MB"
                               if best[s].get("peak_mb") else ""))
                for s in sides))
            continue
        tl, py, hta = (best[s] for s in SIDES)
        for side in sides:
            total[side] += best[side]["s"]
        print(f"{trace.name:40} {size:5.2f} | {tl['s']:7.3f} {py['s']:8.3f} {hta['s']:7.3f} "
              f"{hta['s'] / tl['s']:8.1f} {py['s'] / tl['s']:5.1f} | "
              f"{tl['peak_mb']:5.0f}/{tl['peak_mb'] - tl['base_mb']:<6.0f} "
              f"{hta['peak_mb']:6.0f}/{hta['peak_mb'] - hta['base_mb']:<6.0f}")
    t = total
    if not all(t.values()):
        return
    print(f"{'total (traces all sides read)':40} {'':5} | {t['torchlens']:7.3f} "
          f"{t['torchlens-py']:8.3f} {t['hta']:7.3f} "
          f"{t['hta'] / max(t['torchlens'], 1e-9):8.1f} "
          f"{t['torchlens-py'] / max(t['torchlens'], 1e-9):5.1f}")


if __name__ == "__main__":
    main()
