"""Multi-rank trace analysis (issue 13): HolisticTraceAnalysis vs torchlens on a
folder of per-rank Kineto traces, wall time and peak memory.

Run::

    .bench-venv/bin/python benchmarks/bench_multirank_hta.py \\
        --make 8 32 128 --workdir ../rank-sets [--json OUT.json]
    .bench-venv/bin/python benchmarks/bench_multirank_hta.py FOLDER [...]
    .bench-venv/bin/python benchmarks/bench_multirank_hta.py \\
        --figures benchmarks/hta_reference_figures.json

HolisticTraceAnalysis (PyPI ``HolisticTraceAnalysis``, 0.5.0 measured) is never
a torchlens dependency; it lives in the benchmark venv only, which
``scripts/bench-env`` makes (``.bench-venv``; HTA pulls pandas, plotly,
jupyterlab, pytest... and leaves torch 2.13.0+cpu alone). Interpreters: HTA's
``--peer-python`` (else ``$TORCHLENS_BENCH_PYTHON``, else ``.bench-venv``'s),
torchlens' ``--torchlens-python`` (else ``$TORCHLENS_PYTHON``, else the
checkout's ``.venv``); see ``benchmarks/paths.py``.

``--make N...`` writes ``WORKDIR/ranks<N>`` (``--workdir``, default a new
temporary folder, kept and printed) with ``benchmarks/make_rank_set.py``
(the ``a100`` source: 2-rank DDP ResNet, NCCL; rank r's clock shifted by
r*10 µs) unless it is already there; positional folders are used as they are.

Each side runs in a fresh subprocess, once per folder:

- ``hta``: this file in ``--child`` mode with the bench venv's Python:
  ``TraceAnalysis(trace_dir=FOLDER)`` (trace loading: HTA parses the ranks in a
  ``fork`` pool of ``min(cpu_count, ranks)`` processes with its default ``json``
  backend, aligns the ranks and drops the last profiler step), then, each timed
  on its own, every analysis over **all** ranks with ``visualize=False``:
  ``get_temporal_breakdown()``, ``get_comm_comp_overlap()``,
  ``get_idle_time_breakdown(ranks=all)``, ``get_gpu_kernel_breakdown()``,
  ``get_queue_length_summary(ranks=all)``,
  ``get_cuda_kernel_launch_stats(ranks=all)`` (HTA's own defaults otherwise;
  the per-rank ones default to rank 0 only, which is not the multi-rank job).
- ``torchlens``: ``run_torchlens`` below, ``python -m torchlens analyze FOLDER
  --json`` with ``--torchlens-python`` and
  this checkout first on ``PYTHONPATH``; skipped, and said so, while
  ``python -m torchlens analyze --help`` fails (the command does not exist yet).

Bytecode: both sides run from compiled modules, as a user's install does. HTA
and its dependencies are installed with their ``.pyc`` files; this checkout is a
source tree, and a machine that sets ``PYTHONDONTWRITEBYTECODE=1`` (ours does)
would recompile its ~220 modules on every torchlens run (~0.1 s, a sixth of its
8-rank wall). So before timing, ``bench`` compiles ``torchlens/`` once with the
torchlens interpreter (``compileall``, untimed; ``__pycache__`` is git-ignored);
the variable itself is left as it is for both sides.

With ``--repeat R`` each side runs R times per folder, alternating (first
side swapped every repeat) so a change in the shared machine's load hits both;
the table shows the run with the median wall time. Measured per side: "wall", the whole subprocess from start to exit
(interpreter start, imports, loading, analyses: what a user waits for; the
ratio uses it); "CPU", user + system time of the whole process tree
(``measure``: the bench is a subreaper, so every worker counts; what the
machine's cores share, and steadier than wall on a loaded machine); for HTA
also its import, load and per-analysis times from ``perf_counter`` inside the
child. Memory: the process tree (the child and
every descendant, e.g. HTA's parse pool) is sampled every ``--sample-s``
seconds from ``/proc/PID/smaps_rollup``; "peak PSS" is the largest sum of
proportional set sizes seen (shared pages counted once; the headline), "peak
RSS" the largest sum of resident sizes (fork-shared pages counted per process);
"maxrss" is the child's own ``getrusage(RUSAGE_SELF).ru_maxrss`` (exact, main
process only), "workers" its ``RUSAGE_CHILDREN`` (the largest single worker).

Measured (2026-11-24, 2-core shared machine, no GPU, HolisticTraceAnalysis
0.5.0, pandas 3.1.1, Python 3.11; HTA's parse pool had 2 processes; the
``a100`` rank sets, 0.8 MB gzip / 9.8 MB JSON and ~18k kept events per rank;
torchlens skipped, no ``analyze`` command yet). Two runs at a quiet moment,
"a / b":

====== =========== ============ =========== =========== ============ ========
ranks  load avg    wall s       load s      analyses s  peak PSS MiB maxrss
====== =========== ============ =========== =========== ============ ========
8      0.75 / 0.57 4.8 / 5.6    3.0 / 3.4   1.0 / 1.0   294 / 290    155 MiB
32     0.77 / 0.92 22.9 / 20.4  17.8 / 15.7 4.4 / 4.0   540 / 543    317 MiB
128    1.40 / 1.09 105.7 / 70.7 82.7 / 52.5 22.1 / 17.3 967 / 970    941 MiB
1024*  2.53        289.5        144.5       142.6       3253         3263 MiB
====== =========== ============ =========== =========== ============ ========

(* the ``sampled`` source: ~2.4k kept events per rank, 1.7 MB JSON, so 1024
of them hold about as many events as 136 ``a100`` ranks.) Peak RSS (sum over
the tree) was 398 / 686 / 1098 / 3263 MiB. At 128 ranks (run b) the analyses
took: temporal 3.0 s, overlap 3.9, idle 1.1, kernels 5.9, queue 2.4, launch
1.0. A run at load average 3-7 (other jobs on the machine) gave 15.1 / 70.3 /
156.9 s wall for 8 / 32 / 128 ranks with the same memory (285 / 536 / 955
MiB PSS): the wall time moves 1.5-3x with the machine's load, the memory does
not; compare the sides only within one invocation (``--repeat``).

``--figures PATH`` runs HTA, the same six analyses, on each shared trace in
the shared traces folder (``benchmarks/paths.py``) on its own (a folder holding one symlink, all
ranks, ``show_idle_interval_stats=True``) and writes the figures only (no trace
data) so torchlens' numbers can be compared with them: per rank the temporal
breakdown, comm/comp overlap, idle split per stream (and interval stats),
kernel-type breakdown and top kernels, kernel counts per type and stream,
queue-length stats per stream and launch-stats summaries; or the error HTA
raised, per analysis.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import paths

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRACES = paths.traces()
WHY_FAILS = {  # what the shared traces are, where HTA 0.5.0 fails on them
    "cpu_only_gloo_rank34.json.gz": "CPU-only (gloo) trace: no GPU kernels, so "
    "the temporal breakdown (IndexError) and idle split (ValueError) fail",
    "no_distributed_info.json.gz": "only cpu_op / user_annotation events (no GPU "
    "kernels despite its A100 deviceProperties): temporal and idle fail as above; "
    "the missing distributedInfo itself is fine (HTA takes rank 0)",
    "memory_timeline.raw.gz": "not a Chrome trace but torch's memory-timeline "
    "export (a JSON list), which HTA cannot load",
}
ANALYSES = ["temporal", "overlap", "idle", "kernels", "queue", "launch"]
RUNTIME_CUTOFF_US = 50  # HTA's defaults for get_cuda_kernel_launch_stats
LAUNCH_DELAY_CUTOFF_US = 100


# ---------------------------------------------------------------- the child


def json_safe(x: Any, digits: int | None = 4) -> Any:
    """JSON-safe copy of numbers / containers from pandas (NaN and inf: None),
    floats rounded to ``digits`` (``None``: as they are)."""
    if isinstance(x, dict):
        return {str(k): json_safe(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v, digits) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return None
        return x if digits is None else round(x, digits)
    return x


def _records(df: Any) -> list[dict[str, Any]]:
    if df is None:
        return []
    if df.index.names != [None] or df.index.dtype != "int64":
        df = df.reset_index()  # (rank, stream) or idle_category: keep it
    else:
        df = df.reset_index(drop=True)
    df.columns = [
        "_".join(str(p) for p in c if str(p)) if isinstance(c, tuple) else str(c)
        for c in df.columns
    ]
    return json_safe(df.to_dict(orient="records"))


def _figures(ta: Any, name: str, res: Any) -> Any:
    """The figures of one analysis' result, small."""
    if name == "temporal" or name == "overlap":
        cols = [c for c in res.columns if c not in ("idle_time", "compute_time")]
        cols = [c for c in cols if c != "non_compute_time"]
        return _records(res[cols])
    if name == "idle":
        split, intervals = res
        return {"split": _records(split), "interval_stats": _records(intervals)}
    if name == "kernels":
        by_type, top = res
        return {"by_type": _records(by_type), "top_kernels": _records(top)}
    if name == "queue":
        return _records(res)
    if name == "launch":
        out = {}
        for rank, df in res.items():
            out[str(rank)] = {
                "n": int(len(df)),
                "gpu_shorter_than_cpu": int((df.gpu_duration < df.cpu_duration).sum()),
                f"cpu_duration_gt_{RUNTIME_CUTOFF_US}us": int(
                    (df.cpu_duration > RUNTIME_CUTOFF_US).sum()
                ),
                f"launch_delay_gt_{LAUNCH_DELAY_CUTOFF_US}us": int(
                    (df.launch_delay > LAUNCH_DELAY_CUTOFF_US).sum()
                ),
                "stats": json_safe(
                    df[["cpu_duration", "gpu_duration", "launch_delay"]]
                    .describe()
                    .to_dict()
                ),
            }
        return out
    return None


def _trace_facts(ta: Any) -> dict[str, Any]:
    """Per rank: what HTA kept after loading (events, iterations, kernels by
    HTA's kernel type and by stream)."""
    from hta.utils.utils import get_kernel_type

    sym = ta.t.symbol_table.get_sym_table()
    out: dict[str, Any] = {}
    for rank in ta.t.get_ranks():
        df = ta.t.get_trace(rank)
        gpu = df[df["stream"].ne(-1)]
        types = gpu["name"].map(lambda i: get_kernel_type(sym[i]))
        out[str(rank)] = {
            "events": int(len(df)),
            "gpu_events": int(len(gpu)),
            "iterations": json_safe(sorted(ta.t.get_iterations(rank))),
            "gpu_span_us": (
                # not "end": HTA shifts "ts" to the ranks' common start, not "end"
                json_safe((gpu["ts"] + gpu["dur"]).max() - gpu["ts"].min())
                if len(gpu)
                else None
            ),
            "kernels_by_type": {
                str(k): {
                    "count": int(v),
                    "dur_us": json_safe(gpu["dur"][types == k].sum()),
                }
                for k, v in types.value_counts().items()
            },
            "kernels_by_stream": {
                str(k): int(v) for k, v in gpu["stream"].value_counts().items()
            },
        }
    return out


def child(folder: str, result_path: str, figures: bool) -> int:
    t0 = time.perf_counter()
    import logging

    import pandas as pd
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)  # its per-file warnings
    out: dict[str, Any] = {"import_s": time.perf_counter() - t0, "times_s": {}}
    out["versions"] = {
        "HolisticTraceAnalysis": _version("HolisticTraceAnalysis"),
        "pandas": pd.__version__,
        "python": platform.python_version(),
    }
    t = time.perf_counter()
    try:
        ta = TraceAnalysis(trace_dir=folder)
    except Exception as e:  # noqa: BLE001 - report what HTA raised
        out["load_error"] = f"{type(e).__name__}: {e}"
        _finish(out, result_path)
        return 0
    out["load_s"] = time.perf_counter() - t
    ranks = ta.t.get_ranks()
    out["ranks"] = len(ranks)
    calls = {
        "temporal": lambda: ta.get_temporal_breakdown(visualize=False),
        "overlap": lambda: ta.get_comm_comp_overlap(visualize=False),
        "idle": lambda: ta.get_idle_time_breakdown(
            ranks=ranks, visualize=False, show_idle_interval_stats=figures
        ),
        "kernels": lambda: ta.get_gpu_kernel_breakdown(visualize=False),
        "queue": lambda: ta.get_queue_length_summary(ranks=ranks),
        "launch": lambda: ta.get_cuda_kernel_launch_stats(
            ranks=ranks,
            runtime_cutoff=RUNTIME_CUTOFF_US,
            launch_delay_cutoff=LAUNCH_DELAY_CUTOFF_US,
            visualize=False,
        ),
    }
    errors: dict[str, str] = {}
    figs: dict[str, Any] = {}
    for name in ANALYSES:
        t = time.perf_counter()
        try:
            res = calls[name]()
        except Exception as e:  # noqa: BLE001 - report what HTA raised
            errors[name] = f"{type(e).__name__}: {e}"
            res = None
        out["times_s"][name] = time.perf_counter() - t
        if figures and res is not None:
            figs[name] = _figures(ta, name, res)
    if errors:
        out["errors"] = errors
    if figures:
        out["ranks_list"] = ranks
        out["trace"] = _trace_facts(ta)
        out["figures"] = figs
    _finish(out, result_path)
    return 0


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001
        return None


def _finish(out: dict[str, Any], path: str) -> None:
    out["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["workers_maxrss_mib"] = (
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    )
    Path(path).write_text(json.dumps(out))


# ---------------------------------------------------------------- the parent


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except OSError:
            pass
    return pids


def _mem_kib(pid: int) -> tuple[int, int]:
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def _subreaper() -> bool:
    """Adopt this process's orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``),
    so that their CPU time reaches ``RUSAGE_CHILDREN`` once they are reaped."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_orphans() -> None:
    """Wait for every descendant adopted after the child exited (e.g. a
    ``forkserver`` that outlives its parent by a moment)."""
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return


def measure(cmd: list[str], timeout: float, sample_s: float, **kw: Any) -> dict:
    """Run ``cmd``; wall time, CPU time and the process tree's peak RSS / PSS sums.

    CPU time (``cpu_s`` = ``user_s`` + ``sys_s``): ``getrusage(RUSAGE_CHILDREN)``
    before and after, this process a subreaper, so every process of the tree
    that its parent waited for (pool workers, HTA's fork pool, torchlens'
    forkserver and its workers) counts. On a shared machine it moves less
    than the wall time with the load, and it is what N cores divide.
    """
    reaper = _subreaper()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, start_new_session=True, **kw)
    peak_rss = peak_pss = 0
    procs = 1
    timed_out = False
    while proc.poll() is None:
        pids = _tree(proc.pid)
        procs = max(procs, len(pids))
        mems = [_mem_kib(p) for p in pids]
        peak_rss = max(peak_rss, sum(m[0] for m in mems))
        peak_pss = max(peak_pss, sum(m[1] for m in mems))
        if time.perf_counter() - t0 > timeout:
            os.killpg(proc.pid, 9)  # the session this call started
            timed_out = True
            proc.wait()
            break
        time.sleep(sample_s)
    wall = time.perf_counter() - t0
    if reaper:
        _reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, sys_ = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {
        "rc": proc.returncode,
        "timed_out": timed_out,
        "wall_s": wall,
        "cpu_s": user + sys_,
        "user_s": user,
        "sys_s": sys_,
        "cpu_complete": reaper,
        "peak_pss_mib": peak_pss / 1024,
        "peak_rss_mib": peak_rss / 1024,
        "max_procs": procs,
        "loadavg_before": [round(x, 2) for x in load],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def run_hta(folder: Path, args: argparse.Namespace, figures: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        res_path = Path(tmp) / "result.json"
        log = Path(tmp) / "stderr.log"
        cmd = [args.hta_python, str(Path(__file__).resolve()), "--child", str(folder)]
        cmd += ["--result", str(res_path)] + (["--child-figures"] if figures else [])
        with open(log, "wb") as err:
            m = measure(cmd, args.timeout, args.sample_s, stderr=err, cwd=tmp)
        if res_path.exists():
            m.update(json.loads(res_path.read_text()))
        else:
            m["error"] = log.read_text(errors="replace")[-2000:]
    if "load_s" in m:
        m["work_s"] = m["load_s"] + sum(m["times_s"].values())
    return m


def torchlens_cmd(args: argparse.Namespace) -> list[str] | None:
    """``python -m torchlens analyze`` if this checkout has it, else None."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    probe = [args.torchlens_python, "-m", "torchlens", "analyze", "--help"]
    try:
        r = subprocess.run(probe, capture_output=True, env=env, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return probe[:4] if r.returncode == 0 else None


# ===================================================================== torchlens
# Skipped until ``torchlens analyze RUN_DIR --json`` exists (probed above).
def run_torchlens(folder: Path, args: argparse.Namespace) -> dict:
    base = torchlens_cmd(args)
    if base is None:
        return {"skipped": "`python -m torchlens analyze --help` fails: no command"}
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout.json", Path(tmp) / "stderr.log"
        with open(out, "wb") as o, open(err, "wb") as e:
            m = measure(
                base + [str(folder), "--json"],
                args.timeout,
                args.sample_s,
                stdout=o,
                stderr=e,
                env=env,
                cwd=tmp,
            )
        if m["rc"] != 0:
            m["error"] = err.read_text(errors="replace")[-2000:]
        else:
            try:
                report = json.loads(out.read_text())
                m["json_bytes"] = out.stat().st_size
                if isinstance(report, dict):  # whatever timings it reports
                    for key in ("timings", "times_s", "timing"):
                        if key in report:
                            m["times_s"] = report[key]
            except json.JSONDecodeError as exc:
                m["error"] = f"stdout is not JSON: {exc}"
    return m


# ===================================================================== driver


def make_folder(workdir: Path, n: int, args: argparse.Namespace) -> Path:
    folder = workdir / f"ranks{n}"
    files = list(folder.glob("rank*.pt.trace.json*")) if folder.exists() else []
    if len(files) != n:
        cmd = [sys.executable, str(HERE / "make_rank_set.py"), str(folder)]
        cmd += ["--ranks", str(n), "--force", "--jobs", str(args.make_jobs)]
        subprocess.run(cmd, check=True)
    return folder


def _fmt(x: Any, f: str = "{:.2f}") -> str:
    return "" if x is None else f.format(x)


def table(rows: list[dict]) -> str:
    head = ["ranks", "side", "wall s", "CPU s", "load s"] + [f"{a} s" for a in ANALYSES]
    head += ["peak PSS MiB", "peak RSS MiB", "maxrss MiB", "load avg"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        for side in ("hta", "torchlens"):
            m = row[side]
            if "skipped" in m:
                cells = [str(row["ranks"]), side, m["skipped"]] + [""] * (len(head) - 3)
            else:
                times = m.get("times_s") or {}
                cells = [str(row["ranks"]), side, _fmt(m.get("wall_s"))]
                cells.append(_fmt(m.get("cpu_s")))
                cells.append(_fmt(m.get("load_s")))
                cells += [_fmt(times.get(a), "{:.3f}") for a in ANALYSES]
                cells += [_fmt(m.get("peak_pss_mib"), "{:.0f}")]
                cells += [_fmt(m.get("peak_rss_mib"), "{:.0f}")]
                cells += [_fmt(m.get("maxrss_mib"), "{:.0f}")]
                cells += [_fmt(m.get("loadavg_before", [None])[0])]
            lines.append("| " + " | ".join(cells) + " |")
        if "ratio" in row:
            r = row["ratio"]
            met = "meets" if r["meets_target"] else "misses"
            lines.append(
                f"| {row['ranks']} | torchlens vs HTA | {r['wall_x']:.1f}x faster | "
                f"{r['cpu_x']:.1f}x less | "
                + " | " * len(ANALYSES)
                + f"{r['pss_fraction']:.2f} of HTA's | "
                + f"{r['rss_fraction']:.2f} of HTA's | | {met} >=10x, <=0.5 |"
            )
    return "\n".join(lines)


def bench(args: argparse.Namespace) -> int:
    folders = [Path(f).resolve() for f in args.folders]
    if args.make:
        workdir = Path(args.workdir).resolve() if args.workdir else paths.scratch("multirank")
        print(f"rank sets in {workdir}", file=sys.stderr)
        if workdir == REPO or REPO in workdir.parents:
            raise SystemExit("--workdir must be outside the repository")
        folders += [make_folder(workdir, n, args) for n in args.make]
    # both sides from bytecode (see the module doc): untimed, before any run
    subprocess.run([args.torchlens_python, "-m", "compileall", "-q", str(REPO / "torchlens")],
                   check=True, stdout=subprocess.DEVNULL)
    rows = []
    for folder in folders:
        n = len([p for p in folder.iterdir() if p.name.endswith((".gz", ".json"))])
        print(f"[{n} ranks] {folder}", file=sys.stderr, flush=True)
        row: dict[str, Any] = {"ranks": n, "folder": str(folder)}
        sides = {"hta": run_hta, "torchlens": run_torchlens}
        runs: dict[str, list[dict]] = {"hta": [], "torchlens": []}
        for i in range(args.repeat):  # sides alternate; first side swapped
            for side in list(sides)[:: 1 if i % 2 == 0 else -1]:
                m = sides[side](folder, args)
                runs[side].append(m)
                print(f"  {side}: {_summary(m)}", file=sys.stderr, flush=True)
        for side, ms in runs.items():
            timed = sorted((m for m in ms if "wall_s" in m), key=lambda m: m["wall_s"])
            row[side] = dict(timed[(len(timed) - 1) // 2] if timed else ms[0])
            if len(timed) > 1:  # the run with the median wall time, and all walls
                row[side]["walls_s"] = [m["wall_s"] for m in ms if "wall_s" in m]
                row[side]["peak_pss_mib_max"] = max(m["peak_pss_mib"] for m in timed)
        h, t = row["hta"], row["torchlens"]
        if t.get("rc") == 0 and h.get("rc") == 0 and "error" not in t:
            row["ratio"] = {
                "wall_x": h["wall_s"] / t["wall_s"],
                "cpu_x": h["cpu_s"] / t["cpu_s"],
                "pss_fraction": t["peak_pss_mib"] / h["peak_pss_mib"],
                "rss_fraction": t["peak_rss_mib"] / h["peak_rss_mib"],
            }
            r = row["ratio"]  # issue 13: >= 10x faster at <= half the peak memory
            r["meets_target"] = r["wall_x"] >= 10 and r["pss_fraction"] <= 0.5
        rows.append(row)
    print(table(rows))
    meta = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        },
        "rows": rows,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(meta, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _summary(m: dict) -> str:
    if "skipped" in m:
        return "skipped: " + m["skipped"]
    s = f"wall {m['wall_s']:.1f} s, CPU {m['cpu_s']:.1f} s, peak PSS {m['peak_pss_mib']:.0f} MiB"
    if "load_s" in m:
        s += f", load {m['load_s']:.1f} s, work {m['work_s']:.1f} s"
    for key in ("load_error", "errors", "error"):
        if key in m:
            s += f", {key}: {m[key]}"
    return s


def figures(args: argparse.Namespace) -> int:
    traces = sorted(p for p in TRACES.iterdir() if p.name.endswith(".gz"))
    doc: dict[str, Any] = {
        "what": (
            "HolisticTraceAnalysis' figures on each shared trace, read on its own "
            "(benchmarks/bench_multirank_hta.py --figures). Times in us. With two "
            "or more ProfilerStep#N names in a trace, HTA keeps only CPU events "
            "that start before the last step does, and the GPU kernels they "
            "launched (include_last_profiler_step=False); with 0 or 1 it keeps "
            "all; "
            "'trace' says what it kept (gpu_span_us = first kernel start to last "
            "kernel end). Launch-stat cutoffs: HTA's defaults. 'sampled_rank-0+1' "
            "reads both sampled ranks as one 2-rank set (aligned to a common start)."
        ),
        "settings": {
            "visualize": False,
            "ranks": "all in the file",
            "show_idle_interval_stats": True,
            "consecutive_kernel_delay_ns": 30,
            "kernel_breakdown": {
                "duration_ratio": 0.8,
                "num_kernels": 10,
                "include_memory_kernels": True,
            },
            "runtime_cutoff_us": RUNTIME_CUTOFF_US,
            "launch_delay_cutoff_us": LAUNCH_DELAY_CUTOFF_US,
        },
        "hta_fails_on": {},
        "traces": {},
    }
    sets = [(p.name, [p]) for p in traces]
    pair = [TRACES / "sampled_rank-0.json.gz", TRACES / "sampled_rank-1.json.gz"]
    if all(p.exists() for p in pair):  # the one real 2-rank set: read together
        sets.append(("sampled_rank-0+1 (one 2-rank folder)", pair))
    for name, files in sets:
        with tempfile.TemporaryDirectory() as tmp:
            for f in files:
                os.symlink(f, Path(tmp) / f.name)
            m = run_hta(Path(tmp), args, figures=True)
        doc.setdefault("versions", m.get("versions"))
        keep = {"load_error", "error", "errors", "ranks_list", "trace", "figures"}
        entry = {k: v for k, v in m.items() if k in keep}  # figures, no timings
        doc["traces"][name] = entry
        failed = {k: entry[k] for k in ("load_error", "error", "errors") if k in entry}
        if failed and name in WHY_FAILS:
            failed["why"] = WHY_FAILS[name]
        if failed:
            doc["hta_fails_on"][name] = failed
        print(f"{name}: {_summary(m)}", file=sys.stderr, flush=True)
    Path(args.figures).write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    print(f"wrote {args.figures}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", help="folders of per-rank traces")
    ap.add_argument("--make", type=int, nargs="*", default=[], help="rank counts")
    ap.add_argument("--workdir", default=None,
                    help="where --make writes its rank sets (default: a new temporary folder)")
    ap.add_argument("--make-jobs", type=int, default=2)
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument("--figures", help="write HTA's figures per shared trace here")
    ap.add_argument("--timeout", type=float, default=1800.0, help="s per side")
    ap.add_argument("--sample-s", type=float, default=0.05)
    ap.add_argument("--repeat", type=int, default=1, help="runs per side, alternating")
    ap.add_argument("--peer-python", "--hta-python", dest="hta_python", default=None,
                    help="the Python with HTA (default: $TORCHLENS_BENCH_PYTHON, "
                         "else .bench-venv's; scripts/bench-env)")
    ap.add_argument("--torchlens-python", default=None,
                    help="the Python to run torchlens with (default: $TORCHLENS_PYTHON, "
                         "else the checkout's .venv)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--child-figures", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.hta_python = paths.peer_python(args.hta_python)
    args.torchlens_python = paths.torchlens_python(args.torchlens_python)
    if args.child:
        return child(args.child, args.result, args.child_figures)
    if args.figures:
        return figures(args)
    if not args.folders and not args.make:
        ap.error("give folders or --make N ...")
    return bench(args)


if __name__ == "__main__":
    raise SystemExit(main())
