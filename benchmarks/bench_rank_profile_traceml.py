"""Per-rank step profiling (issue 12): step-time overhead and straggler diagnosis,
bare torchrun vs TraceML (and, once it exists, torchlens ``%ddp_check --profile``).

Run: ``python benchmarks/bench_rank_profile_traceml.py [--runs 2] [--steps 300]
[--slow-ms 5] [--peer-python PY] [--torchlens-python PY]``.

TraceML (PyPI ``traceml-ai``) is never a dependency of torchlens: it lives in
a separate benchmark venv, which ``scripts/bench-env`` makes (``.bench-venv``:
torch 2.13.0 CPU and traceml-ai). The bare and TraceML launches run that venv's
Python (``--peer-python``, else ``$TORCHLENS_BENCH_PYTHON``, else
``.bench-venv``); torchlens runs in ``--torchlens-python`` (else
``$TORCHLENS_PYTHON``, else the checkout's ``.venv``; ``benchmarks/paths.py``).

Every side runs the same job, ``benchmarks/ddp_jobs.py`` (2 ranks, gloo, DDP
MLP, SGD, a DataLoader over synthetic batches; ``OMP_NUM_THREADS=1``), in two
variants: ``healthy`` and ``straggler`` (rank ``--slow-rank``'s dataset sleeps
``--slow-ms`` per batch). The step time is the job's own ``perf_counter``
measurement (``<out>/rank<r>.json``): the median of the steps after the
warm-up, the larger of the two ranks' medians (DDP keeps them in lock-step).
No tool's own figure is used for timing.

- ``bare``: ``python -m torch.distributed.run --nproc_per_node=2 ... ddp_jobs.py``
  (the same launcher flags ``traceml run`` uses).
- ``traceml``: ``traceml run ddp_jobs.py --nproc-per-node 2 --mode summary
  --logs-dir D --run-name R --master-port P --aggregator-port Q --args
  --traceml ...``: the job calls ``traceml.init(mode="auto")`` and wraps each
  step in ``traceml.trace_step(model.module)``. TraceML prints its end-of-run
  summary box to stdout and writes ``D/R/final_summary.json``; the verdict is
  read from the JSON (``primary_diagnosis``: kind and culprit rank) and the raw
  ``Verdict:`` / ``Why:`` lines from stdout.
- ``torchlens``: ``run_torchlens`` below, to be wired to ``%ddp_check
  --profile`` (skipped, and said so, until torchlens has it).

TraceML's live view is ``--mode cli`` (a Rich dashboard in the terminal,
refreshed every ``--interval`` s: "Issue: INPUT STRAGGLER / Why: r1 waited
5.4 ms for input..." over the last 100 steps, with median / worst / worst-rank
/ skew per phase); ``--mode summary`` (the default, used here) is headless and
prints the same verdict once, at the end. ``traceml view D/R/final_summary.json``
prints a stored summary again.

Counting, the same for both tools (issue 26): on the straggler run a hit is
rank 1 named with data loading as the cause; on the healthy run any straggler
verdict is a false alarm, whichever rank and cause.

Within each repeat the sides alternate, first side swapped every repeat, so a
change in the shared machine's load hits both; the overhead is computed per
repeat (paired) and the median pair is printed. "wall" is the whole command,
start-up and TraceML's end-of-run finalisation included; "run CPU s" is the
CPU time of the command and every process it waited for (rusage of children:
ranks, torchrun, TraceML's aggregator).

Measured (2-core machine, torch 2.13.0+cpu, traceml-ai 0.5.0, 300 steps,
--runs 5, load ~1.3): bare 6.54 ms/step, TraceML 6.76 ms/step (paired median
+0.02 ms / +0.2 %; rank CPU per step +7 %; per launch +6 s wall and +5.4 s
CPU); straggler (+5 ms on rank 1) bare 10.07 ms, TraceML 10.42 ms (+3.3 %),
named "INPUT STRAGGLER (CRITICAL) ... R1/N0 waited 5.4 ms for input" in 5/5
runs, no straggler claimed in 0/5 healthy runs. Run-to-run spread of bare
alone is 5.2-7.2 ms, so single-digit overheads are within noise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import paths

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
JOB = HERE / "ddp_jobs.py"
WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_args(a: argparse.Namespace, variant: str, out: Path) -> list[str]:
    args = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--out", str(out)]
    if variant == "straggler":
        args += ["--slow-rank", str(a.slow_rank), "--slow-ms", str(a.slow_ms)]
    return args


def env() -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    e.pop("PYTHONPATH", None)
    return e


def read_steps(out: Path) -> dict[str, Any]:
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {"step_ms": max(r["median_ms"] for r in ranks),
            "cpu_step_ms": statistics.fmean(r["cpu_median_ms"] for r in ranks),
            "rank_median_ms": [round(r["median_ms"], 3) for r in ranks],
            "rank_p90_ms": [round(r["p90_ms"], 3) for r in ranks]}


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_cmd(cmd: list[str], timeout: float,
            cwd: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """(process, wall s, CPU s of the command and every descendant it waited for)."""
    start, cpu0 = time.perf_counter(), children_cpu()
    proc = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True,
                          timeout=timeout)
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]}... exited {proc.returncode}\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    return proc, wall, cpu


def run_bare(a: argparse.Namespace, variant: str, work: Path, tag: str) -> dict[str, Any]:
    out = work / f"bare-{tag}"
    cmd = [a.python, "-m", "torch.distributed.run", "--nnodes=1",
           f"--nproc_per_node={WORLD}", "--node_rank=0", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(JOB), *job_args(a, variant, out)]
    _, wall, cpu = run_cmd(cmd, a.timeout, work)
    return {**read_steps(out), "wall_s": wall, "cpu_s": cpu}


BOX = re.compile(r"^\|\s*(.*?)\s*\|?\s*$")


def box_line(stdout: str, label: str) -> str | None:
    """The text of the summary-box line starting with ``label`` (box bars removed)."""
    for line in stdout.splitlines():
        m = BOX.match(line.strip())
        text = (m.group(1) if m else line).strip()
        if text.startswith(label):
            return text
    return None


def traceml_verdict(summary: dict[str, Any], stdout: str) -> dict[str, Any]:
    diag = summary.get("primary_diagnosis") or {}
    st = (summary.get("step_time") or {}).get("diagnosis") or {}
    ev = st.get("evidence") or {}
    ranks = st.get("ranks") or []
    kind = diag.get("kind") or st.get("kind")
    culprit = None  # only a straggler verdict names a rank
    if kind and "STRAGGLER" in kind:
        culprit = ev.get("culprit_rank", ranks[0] if ranks else None)
    return {"kind": kind, "status": diag.get("status"), "severity": diag.get("severity"),
            "culprit_rank": culprit, "summary": diag.get("summary"),
            "verdict_line": box_line(stdout, "Verdict:"), "why_line": box_line(stdout, "Why:")}


def run_traceml(a: argparse.Namespace, variant: str, work: Path, tag: str) -> dict[str, Any]:
    out = work / f"traceml-{tag}"
    logs = work / "traceml-logs"
    traceml = Path(a.python).with_name("traceml")
    cmd = [str(traceml), "run", str(JOB), "--nproc-per-node", str(WORLD), "--mode", "summary",
           "--logs-dir", str(logs), "--run-name", tag, "--master-port", str(free_port()),
           "--aggregator-port", str(free_port()), "--args", "--traceml",
           *job_args(a, variant, out)]
    proc, wall, cpu = run_cmd(cmd, a.timeout, work)
    summary = json.loads((logs / tag / "final_summary.json").read_text())
    return {**read_steps(out), "wall_s": wall, "cpu_s": cpu,
            "verdict": traceml_verdict(summary, proc.stdout)}


# ---------------------------------------------------------------------------
# TORCHLENS SIDE: to be wired when `%ddp_check fn --profile` exists (issue 12).
# It runs in the project's own venv (torchlens never sees TraceML); the job is
# `ddp_jobs.train(rank, world_size, steps=..., mark_step=torchlens.step,
# out=..., slow_rank=..., slow_ms=...)`, passed to `torchlens.ddp_check(...,
# profile=True)` (cloudpickle pickles it by reference, so the ranks need
# `benchmarks/` on sys.path). Its step time comes from the same rank<r>.json;
# its verdict from the DdpResult (slow rank and cause), raw line included.
# ---------------------------------------------------------------------------

def torchlens_python(a: argparse.Namespace) -> str | None:
    py = paths.torchlens_python(a.torchlens_python)
    return py if Path(py).exists() else None


def torchlens_profile_support(a: argparse.Namespace) -> str | None:
    """None when torchlens (this checkout) has ``ddp_check(..., profile=...)``, else why not."""
    py = torchlens_python(a)
    if py is None:
        return "no Python with torchlens found (--torchlens-python)"
    probe = ("import inspect, torchlens.frontends.ddp.api as d; "
             "print('profile' in inspect.signature(d.ddp_check).parameters)")
    e = dict(env(), PYTHONPATH=str(REPO))
    r = subprocess.run([py, "-c", probe], env=e, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return f"import torchlens failed: {r.stderr.strip().splitlines()[-1:]}"
    if r.stdout.strip() != "True":
        return "torchlens.ddp_check has no profile option yet"
    return None


# Run in torchlens' own venv: the job's train() under ddp_check(profile=True) at
# its defaults (--profile alone: the 3% budget), the verdict from the result.
TORCHLENS_DRIVER = """
import functools, json, sys
sys.path.insert(0, sys.argv[1])
import ddp_jobs, torchlens
from torchlens.frontends.ddp.api import ddp_check
kw = json.loads(sys.argv[2])
run_dir = kw.pop("run_dir")
fn = functools.partial(ddp_jobs.train, mark_step=torchlens.step, **kw)
res = ddp_check(fn, world_size=2, backend="gloo", profile=True, run_dir=run_dir, live=False,
                timeout=120)
sr = res.slow_rank()
prof = res.records.profiling
print("TORCHLENS " + json.dumps({"outcome": res.records.outcome, "rank": sr.rank,
      "cause": sr.cause, "words": str(sr.finding), "every": prof.every,
      "profiled": sum(len(s) for s in prof.summaries)}))
"""


def run_torchlens(a: argparse.Namespace, variant: str, work: Path, tag: str) -> dict[str, Any]:
    """Same job under ``%ddp_check --profile``; returns the same keys as ``run_traceml``."""
    out = work / f"torchlens-{tag}"
    kw: dict[str, Any] = {"steps": a.steps, "warmup": a.warmup, "out": str(out),
                          "run_dir": str(work / f"torchlens-run-{tag}")}
    if variant == "straggler":
        kw.update(slow_rank=a.slow_rank, slow_ms=a.slow_ms)
    cmd = [torchlens_python(a) or "python", "-c", TORCHLENS_DRIVER, str(HERE), json.dumps(kw)]
    e = dict(env(), PYTHONPATH=str(REPO))
    start, cpu0 = time.perf_counter(), children_cpu()
    proc = subprocess.run(cmd, cwd=work, env=e, capture_output=True, text=True,
                          timeout=a.timeout)
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu0
    line = next((x for x in proc.stdout.splitlines() if x.startswith("TORCHLENS ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"torchlens side exited {proc.returncode}\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    got = json.loads(line.removeprefix("TORCHLENS "))
    kind = f"STRAGGLER ({got['cause']})" if got["rank"] is not None else "NO SLOW RANK"
    return {**read_steps(out), "wall_s": wall, "cpu_s": cpu, "profiled_every": got["every"],
            "verdict": {"kind": kind, "culprit_rank": got["rank"], "cause": got["cause"],
                        "verdict_line": got["words"],
                        "why_line": f"one step in {got['every']} profiled "
                                    f"({got['profiled']} summaries)"}}


SIDES = {"bare": run_bare, "traceml": run_traceml, "torchlens": run_torchlens}


def loadavg() -> float:
    return os.getloadavg()[0]


def fmt_range(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def paired(records: list[dict[str, Any]], rows: list[dict[str, Any]], key: str,
           pct: bool) -> str:
    """Median over repeats of (row - the bare run of the same repeat and variant)."""
    pairs = [(r[key], b[key]) for r in rows for b in records
             if b["side"] == "bare" and b["variant"] == r["variant"] and b["run"] == r["run"]
             and r["side"] != "bare"]
    if not pairs:
        return "-"
    d = statistics.median(100 * (t - b) / b if pct else t - b for t, b in pairs)
    return f"{d:+.1f}" if pct else f"{d:+.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2, help="repeats of each side and variant")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-ms", type=float, default=5.0)
    p.add_argument("--variants", default="healthy,straggler")
    p.add_argument("--sides", default="bare,traceml,torchlens")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per launch")
    p.add_argument("--torchlens-python", default=None,
                   help="the Python to run torchlens with (default: $TORCHLENS_PYTHON, "
                        "else the checkout's .venv)")
    p.add_argument("--peer-python", default=None,
                   help="the Python with TraceML (default: $TORCHLENS_BENCH_PYTHON, "
                        "else .bench-venv's; scripts/bench-env)")
    p.add_argument("--json", default=None, help="write every run's record here")
    p.add_argument("--keep", default=None, help="keep step files and TraceML logs in this folder")
    a = p.parse_args(argv)
    a.python = paths.peer_python(a.peer_python)

    sides = [s for s in a.sides.split(",") if s]
    if "traceml" in sides and not Path(a.python).with_name("traceml").exists():
        print(f"TraceML is not installed beside {a.python}: make the peers' venv with "
              "scripts/bench-env, or name one with --peer-python", file=sys.stderr)
        return 2
    skipped: dict[str, str] = {}
    if "torchlens" in sides:
        why = torchlens_profile_support(a)
        if why is not None:
            skipped["torchlens"] = why
            sides.remove("torchlens")

    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench-rank-profile-"))
    work.mkdir(parents=True, exist_ok=True)
    variants = [v for v in a.variants.split(",") if v]
    print(f"job: {a.steps} steps, warm-up {a.warmup}, 2 ranks gloo, OMP_NUM_THREADS=1; "
          f"straggler: rank {a.slow_rank} +{a.slow_ms:g} ms/batch in __getitem__; "
          f"{a.runs} run(s) per side; load average {loadavg():.2f}", flush=True)
    for side, why in skipped.items():
        print(f"{side}: skipped ({why})", flush=True)

    records: list[dict[str, Any]] = []
    try:
        for i in range(a.runs):
            for variant in variants:
                order = sides if i % 2 == 0 else sides[::-1]
                for side in order:
                    tag = f"{variant}-{side}-{i}"
                    load = loadavg()
                    rec = {"run": i, "variant": variant, "side": side, "load_before": load,
                           **SIDES[side](a, variant, work, tag)}
                    records.append(rec)
                    v = rec.get("verdict")
                    print(f"  run {i} {variant:9s} {side:9s} step {rec['step_ms']:6.2f} ms "
                          f"(CPU {rec['cpu_step_ms']:5.2f})  wall {rec['wall_s']:5.1f} s "
                          f"CPU {rec['cpu_s']:5.1f} s  load {load:4.1f}"
                          + (f"  -> {v['kind']}" + ("" if v["culprit_rank"] is None else
                                                   f" rank {v['culprit_rank']}")
                             if v else ""), flush=True)
    finally:
        if a.json:
            Path(a.json).write_text(json.dumps({"args": vars(a), "skipped": skipped,
                                                "records": records}, indent=1))
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)

    print()
    print("step ms: wall per step, median of runs (min-max); CPU ms: the rank process's CPU per "
          "step; run CPU s: the whole command and its descendants. +x: median over runs of "
          "(side - bare) in the same repeat")
    print(f"{'variant':10s} {'side':10s} {'step ms':>22s} {'+ms':>6s} {'+%':>6s} "
          f"{'CPU ms':>6s} {'+%':>6s} {'wall s':>6s} {'run CPU s':>9s} {'+s':>6s}  straggler named")
    for variant in variants:
        for side in sides:
            rows = [r for r in records if r["variant"] == variant and r["side"] == side]
            if not rows:
                continue

            named = "-"
            verdicts = [r["verdict"] for r in rows if r.get("verdict")]
            if verdicts:
                # straggler run: the rank and its cause (TraceML's INPUT_STRAGGLER,
                # torchlens' cause "data"); even run: any straggler verdict, whichever
                # rank and cause, for both tools (issue 26)
                said = [v for v in verdicts if v["kind"] and "STRAGGLER" in v["kind"]]
                hits = len(said) if variant != "straggler" else sum(
                    1 for v in said if v["culprit_rank"] == a.slow_rank
                    and ("INPUT" in v["kind"] or v.get("cause") == "data"))
                named = (f"{hits}/{len(verdicts)}" if variant == "straggler"
                         else f"false alarms {hits}/{len(verdicts)}")
            def med(key: str, rows: list[dict[str, Any]] = rows) -> float:
                return statistics.median(r[key] for r in rows)

            def over(key: str, pct: bool, rows: list[dict[str, Any]] = rows) -> str:
                return paired(records, rows, key, pct)

            print(f"{variant:10s} {side:10s} {fmt_range([r['step_ms'] for r in rows]):>22s} "
                  f"{over('step_ms', False):>6s} {over('step_ms', True):>6s} "
                  f"{med('cpu_step_ms'):6.2f} {over('cpu_step_ms', True):>6s} "
                  f"{med('wall_s'):6.1f} {med('cpu_s'):9.1f} {over('cpu_s', False):>6s}  {named}")
    print()
    for r in records:
        v = r.get("verdict")
        if v:
            print(f"{r['variant']} run {r['run']} {r['side']}: {v['verdict_line']} | {v['why_line']}")
    print(f"\nload average at the end {loadavg():.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
