"""The Hugging Face Trainer straggler job under torchlens and under TraceML's own
HF integration, side by side (issues 23 and 26): what each names, and the
overhead of each over the same job run bare.

Run: ``python benchmarks/bench_hf_traceml.py [--runs 3] [--steps 30] [--slow-ms 30]
[--peer-python PY]``.

TraceML (PyPI ``traceml-ai``) and transformers are never torchlens
dependencies: they live in a benchmark venv of their own, which
``scripts/bench-env`` makes (``.bench-venv``: torch 2.13.0 CPU, traceml-ai,
transformers, accelerate and torchlens from this checkout, no extras). Every
launch runs that venv's Python (``--peer-python``, else
``$TORCHLENS_BENCH_PYTHON``, else ``.bench-venv``; ``benchmarks/paths.py``).

The job is ``benchmarks/hf_trainer_job.py``: a tiny BERT from a config,
``Trainer.train()`` for ``--steps`` optimizer steps, 2 gloo ranks under
torchrun, ``OMP_NUM_THREADS=1``; it never imports either tool. Two scenarios:
``straggler`` (rank 1's data collator sleeps ``--slow-ms`` per batch) and
``even`` (nobody sleeps). Three variants, the same torchrun flags each
(``--nnodes=1 --nproc_per_node=2 --node_rank=0 --master_addr --master_port``,
the ones ``traceml run`` uses):

- ``bare``: ``python -m torch.distributed.run ... hf_trainer_job.py``.
- ``torchlens``: ``python -m torchlens run --out D -- python -m
  torch.distributed.run ...`` (no code change: the ranks attach at start and
  ``TorchlensCallback`` is added to the Trainer). Work it does: a step record
  for every optimizer step (host phase timers: data, forward, backward,
  optimizer, collective; RSS), sent to the collector by a heartbeat thread;
  ``torch.profiler`` on steps 4 and 9, then one step in N chosen to keep that
  cost under 3 % of the step, each profiled step's trace exported and
  summarised on a background thread; the live terminal view; the verdict.
  What it names: the ``verdict:`` line it prints at the end.
- ``traceml``: ``traceml run hf_trainer_job.py --nproc-per-node 2 --mode
  summary ...`` (no code change: its launcher sees ``transformers.trainer``
  load and adds ``TraceMLTrainerCallback``, ``traceml.init(mode="auto")``).
  Work it does: every step bracketed by ``trace_step``: DataLoader fetch and
  H2D timing, forward/backward/optimizer auto-timers, step memory, system and
  process samplers every 2 s, all sent over TCP to an aggregator process that
  writes SQLite and, at the end, ``final_summary.json`` and a summary box.
  What it names: the summary box's ``Verdict:`` (``primary_diagnosis`` in the
  JSON), and every rank-straggler entry in its issue list
  (``step_time.issues``, kinds ``*STRAGGLER``, with their culprit rank).

Inside each timer: "step ms" is the job's own ``perf_counter`` between
consecutive optimizer-step ends (after ``--warmup`` steps), the median over the
timed steps, the larger of the two ranks' medians; "mean" is the same steps'
mean, which (unlike the median) includes torchlens' profiled steps. "wall s"
is the whole command: interpreter start, imports, rendezvous, training, each
tool's start-up and end-of-run work (TraceML's finalisation, torchlens'
verdict). "CPU s" is that command's and all its descendants' CPU time.

Counting, the same for both tools (issue 26): a run "names a slow rank" when
the tool's headline verdict names one (torchlens: ``rank R is the slow rank``;
TraceML: a ``*STRAGGLER`` primary diagnosis); TraceML's issue list is counted
too, in its own column, as it prints those below the verdict. On the even run
any slow-rank verdict is a false alarm, whichever rank and cause. On the
straggler run a hit is rank 1 named (with its cause shown as printed).

Interleaving: within each repeat the scenarios and variants alternate and the
variant order is reversed every repeat; overheads are paired (each tool
against the bare run of the same repeat and scenario), and the median pair is
printed.
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
JOB = HERE / "hf_trainer_job.py"
WORLD = 2
STRAGGLER_KINDS = {"STRAGGLER", "INPUT_STRAGGLER", "COMPUTE_STRAGGLER", "H2D_STRAGGLER"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_flags() -> list[str]:
    return ["--nnodes=1", f"--nproc_per_node={WORLD}", "--node_rank=0",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}"]


def job_args(a: argparse.Namespace, scenario: str, out: Path) -> list[str]:
    slow = a.slow_ms if scenario == "straggler" else 0.0
    return [str(out), "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--slow-rank", str(a.slow_rank), "--slow-ms", str(slow)]


def env(work: Path) -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR",
             HF_HUB_OFFLINE="1", HF_HOME=str(work / "hf"))
    e.pop("PYTHONPATH", None)
    return e


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_cmd(cmd: list[str], a: argparse.Namespace, work: Path) -> tuple[str, float, float]:
    """(stdout + stderr, wall s, CPU s of the command and every descendant it waited for)."""
    start, cpu0 = time.perf_counter(), children_cpu()
    proc = subprocess.run(cmd, cwd=work, env=env(work), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=a.timeout)
    wall, cpu = time.perf_counter() - start, children_cpu() - cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:5])}... exited {proc.returncode}\n"
                           f"{proc.stdout[-4000:]}")
    return proc.stdout, wall, cpu


def read_steps(out: Path) -> dict[str, Any]:
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {"step_ms": max(r["median_ms"] for r in ranks),
            "mean_ms": max(r["mean_ms"] for r in ranks),
            "rank_median_ms": [round(r["median_ms"], 2) for r in ranks]}


def run_bare(a: argparse.Namespace, scenario: str, work: Path, tag: str) -> dict[str, Any]:
    out = work / tag
    cmd = [a.python, "-m", "torch.distributed.run", *torchrun_flags(), str(JOB),
           *job_args(a, scenario, out)]
    _, wall, cpu = run_cmd(cmd, a, work)
    return {**read_steps(out), "wall_s": wall, "cpu_s": cpu}


# every slow-rank verdict, the unexplained one included ("no measured part
# explains it"), which an "its ... took" pattern alone missed (issue 26)
SLOW = re.compile(r"rank (\d+) is the slow rank: (?:its (.+?) took|(no measured part))")


def run_torchlens(a: argparse.Namespace, scenario: str, work: Path, tag: str) -> dict[str, Any]:
    out, run_dir = work / tag, work / f"{tag}-run"
    cmd = [a.python, "-m", "torchlens", "run", "--out", str(run_dir), "--",
           a.python, "-m", "torch.distributed.run", *torchrun_flags(), str(JOB),
           *job_args(a, scenario, out)]
    text, wall, cpu = run_cmd(cmd, a, work)
    line = next((x.strip() for x in text.splitlines() if x.startswith("verdict:")), None)
    if line is None:
        raise RuntimeError(f"torchlens run printed no verdict:\n{text[-4000:]}")
    m = SLOW.search(line)
    profiled = sum(1 for _ in (run_dir / "rank0" / "summaries.jsonl").open()) \
        if (run_dir / "rank0" / "summaries.jsonl").exists() else 0
    named = f"rank {m.group(1)} ({m.group(2) or m.group(3)})" if m else "none"
    return {**read_steps(out), "wall_s": wall, "cpu_s": cpu,
            "headline_rank": int(m.group(1)) if m else None, "named": named,
            "listed_ranks": [], "listed": "-", "words": line[:200],
            "work": f"{profiled} profiled steps of {a.steps}"}


def box_line(text: str, label: str) -> str | None:
    for line in text.splitlines():
        s = line.strip().strip("|").strip()
        if s.startswith(label):
            return s
    return None


def run_traceml(a: argparse.Namespace, scenario: str, work: Path, tag: str) -> dict[str, Any]:
    out, logs = work / tag, work / "traceml-logs"
    cmd = [str(Path(a.python).with_name("traceml")), "run", str(JOB),
           "--nproc-per-node", str(WORLD), "--mode", "summary", "--logs-dir", str(logs),
           "--run-name", tag, "--master-port", str(free_port()),
           "--aggregator-port", str(free_port()), "--args", *job_args(a, scenario, out)]
    text, wall, cpu = run_cmd(cmd, a, work)
    summary = json.loads((logs / tag / "final_summary.json").read_text())
    diag = summary.get("primary_diagnosis") or {}
    st = summary.get("step_time") or {}
    kind = diag.get("kind")
    ev = diag.get("evidence") or {}
    head = ev.get("culprit_rank") if kind in STRAGGLER_KINDS else None
    listed = [(i.get("kind"), (i.get("evidence") or {}).get("culprit_rank",
               (i.get("ranks") or [None])[0]))
              for i in st.get("issues") or [] if i.get("kind") in STRAGGLER_KINDS]
    if kind in STRAGGLER_KINDS and head is None:
        head = next((r for k, r in listed if k == kind), None)
    median = ((st.get("global") or {}).get("median") or {}).get("step_time_ms") or {}
    return {**read_steps(out), "wall_s": wall, "cpu_s": cpu, "headline_rank": head,
            "named": f"{diag.get('status')}" + (f" rank {head}" if head is not None else "")
                     + f" (JSON ranks {(st.get('diagnosis') or {}).get('ranks')})",
            "listed_ranks": [r for _, r in listed],
            "listed": ", ".join(f"{k} r{r}" for k, r in listed) or "none",
            "words": f"{box_line(text, 'Verdict:')} | {box_line(text, 'Why:')}",
            "work": f"its Step Time {median.get('value') or 0:.1f} ms (R{median.get('idx')})"}


VARIANTS = {"bare": run_bare, "torchlens": run_torchlens, "traceml": run_traceml}


def paired(records: list[dict[str, Any]], rows: list[dict[str, Any]], key: str) -> str:
    """Median over repeats of 100 * (row / bare of the same repeat and scenario - 1)."""
    d = [100 * (r[key] / b[key] - 1) for r in rows for b in records
         if b["variant"] == "bare" and b["scenario"] == r["scenario"] and b["run"] == r["run"]]
    return f"{statistics.median(d):+.1f}" if d and rows[0]["variant"] != "bare" else "-"


def report(a: argparse.Namespace, records: list[dict[str, Any]], scenarios: list[str],
           variants: list[str]) -> None:
    print("\nstep ms: the job's median step (max of ranks), median of runs (min-max); "
          "mean: mean step, median of runs; +%: paired overhead vs bare (median over runs)")
    print(f"{'scenario':9s} {'variant':9s} {'step ms':>20s} {'+%':>6s} {'mean ms':>7s} "
          f"{'+%':>6s} {'wall s':>6s} {'+%':>6s} {'CPU s':>6s} {'+%':>6s}  verdicts")
    for scenario in scenarios:
        for variant in variants:
            rows = [r for r in records if r["scenario"] == scenario and r["variant"] == variant]
            if not rows:
                continue
            steps = [r["step_ms"] for r in rows]
            verdicts = "-"
            if variant != "bare":
                head = sum(r["headline_rank"] is not None for r in rows)
                listed = sum(bool(r["listed_ranks"]) for r in rows)
                n = len(rows)
                if scenario == "even":
                    verdicts = f"false alarms {head}/{n} (verdict)"
                else:
                    hits = sum(r["headline_rank"] == a.slow_rank for r in rows)
                    verdicts = f"rank {a.slow_rank} named {hits}/{n} (verdict)"
                if variant == "traceml":
                    hits = sum(a.slow_rank in r["listed_ranks"] for r in rows)
                    verdicts += (f", {listed}/{n} in its issue list" if scenario == "even"
                                 else f", {hits}/{n} in its issue list")
            print(f"{scenario:9s} {variant:9s} "
                  f"{statistics.median(steps):7.2f} ({min(steps):.2f}-{max(steps):.2f}) "
                  f"{paired(records, rows, 'step_ms'):>6s} "
                  f"{statistics.median(r['mean_ms'] for r in rows):7.2f} "
                  f"{paired(records, rows, 'mean_ms'):>6s} "
                  f"{statistics.median(r['wall_s'] for r in rows):6.1f} "
                  f"{paired(records, rows, 'wall_s'):>6s} "
                  f"{statistics.median(r['cpu_s'] for r in rows):6.1f} "
                  f"{paired(records, rows, 'cpu_s'):>6s}  {verdicts}")
    print("\nwhat each named, per run:")
    for r in records:
        if r["variant"] != "bare":
            print(f"  {r['scenario']:9s} run {r['run']} {r['variant']:9s} -> {r['named']}; "
                  f"issue list: {r['listed']}; {r['work']}\n      {r['words']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="repeats of each variant and scenario")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="step intervals left out of step ms")
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-ms", type=float, default=30.0)
    p.add_argument("--scenarios", default="straggler,even")
    p.add_argument("--variants", default="bare,torchlens,traceml")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per launch")
    p.add_argument("--json", default=None, help="write every run's record here")
    p.add_argument("--keep", default=None, help="keep run folders and TraceML logs here")
    p.add_argument("--peer-python", default=None,
                   help="the Python with TraceML, transformers and torchlens (default: "
                        "$TORCHLENS_BENCH_PYTHON, else .bench-venv's; scripts/bench-env)")
    a = p.parse_args(argv)
    a.python = paths.peer_python(a.peer_python)

    variants = [v for v in a.variants.split(",") if v]
    scenarios = [s for s in a.scenarios.split(",") if s]
    if "traceml" in variants and not Path(a.python).with_name("traceml").exists():
        print(f"TraceML is not installed beside {a.python}: make the peers' venv with "
              "scripts/bench-env, or name one with --peer-python", file=sys.stderr)
        return 2
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench-hf-traceml-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"job: HF Trainer, tiny BERT, {a.steps} optimizer steps (first {a.warmup} intervals "
          f"untimed), 2 gloo ranks, OMP_NUM_THREADS=1; straggler: rank {a.slow_rank}'s "
          f"collator sleeps {a.slow_ms:g} ms a batch; {a.runs} run(s) each; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    records: list[dict[str, Any]] = []
    failed: list[str] = []
    try:
        for i in range(a.runs):
            for scenario in scenarios:
                for variant in (variants if i % 2 == 0 else variants[::-1]):
                    tag = f"{scenario}-{variant}-{i}"
                    load = os.getloadavg()[0]
                    try:
                        got = VARIANTS[variant](a, scenario, work, tag)
                    except RuntimeError as exc:  # printed, counted, tried once more
                        failed.append(f"{tag}: {str(exc).splitlines()[0]}")
                        print(f"  run {i} {scenario} {variant}: launch failed, once more "
                              f"({failed[-1]})", flush=True)
                        got = VARIANTS[variant](a, scenario, work, f"{tag}-again")
                    rec = {"run": i, "scenario": scenario, "variant": variant, "load": load,
                           **got}
                    records.append(rec)
                    print(f"  run {i} {scenario:9s} {variant:9s} step {rec['step_ms']:6.2f} ms "
                          f"mean {rec['mean_ms']:6.2f}  wall {rec['wall_s']:5.1f} s  "
                          f"CPU {rec['cpu_s']:5.1f} s  load {load:4.1f}"
                          + (f"  -> {rec['named']}" if "named" in rec else ""), flush=True)
    finally:
        if a.json:
            Path(a.json).write_text(json.dumps({"args": vars(a), "records": records}, indent=1))
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(a, records, scenarios, variants)
    print(f"\nlaunches that failed and were run again: {len(failed)}"
          + "".join(f"\n  {f}" for f in failed))
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
