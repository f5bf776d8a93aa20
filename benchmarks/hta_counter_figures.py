"""HTA's launch statistics, queue length, time at a full queue and memory
bandwidth on each shared trace, written to ``hta_counter_figures.json`` so
``compare_hta_figures.py`` can set torchlens' figures beside them (HTA is not
needed to read that file).

Run with the benchmark venv (HolisticTraceAnalysis 0.5.0, never a torchlens
dependency)::

    .bench-venv/bin/python benchmarks/hta_counter_figures.py \\
        [--traces ../shared/testdata/traces] [--out benchmarks/hta_counter_figures.json]

(``scripts/bench-env`` makes ``.bench-venv``; the default traces are
``benchmarks/paths.py``'s.)

Each trace is read on its own (a folder holding one symlink), twice: HTA's
default (nanosecond traces rounded to whole µs: start up, end down) and with
``HTA_DISABLE_NS_ROUNDING=1`` (times as in the file, as torchlens reads
them), each in a fresh process since HTA reads the flag while parsing.
Recorded per rank: ``get_cuda_kernel_launch_stats`` (HTA's default cutoffs,
``include_memory_events=True``) as counts and ``describe()`` of
cpu_duration, gpu_duration and launch_delay; ``get_queue_length_summary``
per stream; ``get_time_spent_blocked_on_full_queue`` on the queue series;
``get_memory_bw_summary`` per memory kind; and the idle split per stream
(``get_idle_time_breakdown``) and kernel counts per HTA kernel type, so the
rounding-free figures can be compared too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# this folder is on sys.path when run as a script
import paths
from bench_multirank_hta import json_safe

HERE = Path(__file__).resolve().parent
TRACES = paths.traces()


def _clean(x: Any) -> Any:
    return json_safe(x, digits=None)  # unrounded: compared to 0.5%


def _describe(series: Any) -> dict[str, Any]:
    d = series.describe()
    return _clean({k: d[k] for k in d.index})


def child(folder: str) -> dict[str, Any]:
    import logging

    from hta.trace_analysis import TraceAnalysis
    from hta.utils.utils import get_kernel_type

    logging.getLogger("hta").setLevel(logging.ERROR)
    try:
        ta = TraceAnalysis(trace_dir=folder)
    except Exception as e:  # noqa: BLE001 - what HTA raised is the figure
        return {"load_error": f"{type(e).__name__}: {e}"}
    ranks = ta.t.get_ranks()
    out: dict[str, Any] = {"ranks": ranks, "errors": {}}

    def attempt(name: str, fn: Any) -> Any:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            out["errors"][name] = f"{type(e).__name__}: {e}"
            return None

    launch = attempt("launch", lambda: ta.get_cuda_kernel_launch_stats(
        ranks=ranks, runtime_cutoff=50, launch_delay_cutoff=100, visualize=False))
    if launch is not None:
        out["launch"] = {}
        for rank, df in launch.items():
            short = (df.cpu_duration <= 50) & (df.gpu_duration < df.cpu_duration)
            out["launch"][str(rank)] = {
                "n": int(len(df)),
                "gpu_shorter_than_cpu": int((df.gpu_duration < df.cpu_duration).sum()),
                "short_kernels": int(short.sum()),
                "runtime_outliers": int((df.cpu_duration > 50).sum()),
                "delay_outliers": int((df.launch_delay > 100).sum()),
                **{c: _describe(df[c]) for c in ("cpu_duration", "gpu_duration",
                                                 "launch_delay")},
            }
    series = attempt("queue_series", lambda: ta.get_queue_length_time_series(ranks=ranks))
    if series:
        out["queue"] = []
        for rank, df in series.items():
            for stream, g in df.groupby("stream"):
                out["queue"].append({"rank": rank, "stream": stream,
                                     **_describe(g["queue_length"])})
        full = attempt("queue_full", lambda: ta.get_time_spent_blocked_on_full_queue(series))
        out["queue_full"] = [] if full is None else _clean(full.to_dict("records"))
    bw = attempt("memory_bw", lambda: ta.get_memory_bw_summary(ranks=ranks))
    if bw is not None:
        bw = bw.reset_index()
        bw.columns = ["_".join(str(p) for p in c if str(p)) if isinstance(c, tuple) else c
                      for c in bw.columns]
        out["memory_bw"] = _clean(bw.to_dict("records"))
    idle = attempt("idle", lambda: ta.get_idle_time_breakdown(ranks=ranks, visualize=False))
    if idle is not None:
        out["idle"] = _clean(idle[0].to_dict("records"))
    sym = ta.t.symbol_table.get_sym_table()
    out["kernels_by_type"] = {}
    for rank in ranks:
        df = ta.t.get_trace(rank)
        gpu = df[df["stream"].ne(-1)]
        types = gpu["name"].map(lambda i: get_kernel_type(sym[i]))
        out["kernels_by_type"][str(rank)] = _clean(types.value_counts().to_dict())
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default=str(TRACES))
    ap.add_argument("--out", default=str(HERE / "hta_counter_figures.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    import importlib.metadata as md

    doc: dict[str, Any] = {
        "what": __doc__.split("\n\n")[0],
        "HolisticTraceAnalysis": md.version("HolisticTraceAnalysis"),
        "modes": {"rounded": "HTA's default", "ns": "HTA_DISABLE_NS_ROUNDING=1"},
        "traces": {},
    }
    for path in sorted(Path(args.traces).glob("*.gz")):
        entry = {}
        for mode, flag in (("rounded", "0"), ("ns", "1")):
            with tempfile.TemporaryDirectory() as tmp:
                os.symlink(path.resolve(), Path(tmp) / path.name)
                env = dict(os.environ, HTA_DISABLE_NS_ROUNDING=flag)
                r = subprocess.run([sys.executable, __file__, "--child", tmp], env=env,
                                   capture_output=True, text=True, cwd=tmp, timeout=1800)
            try:
                entry[mode] = json.loads(r.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                entry[mode] = {"error": r.stderr[-1500:]}
        doc["traces"][path.name] = entry
        print(path.name, "done", file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
