"""How often torchlens names a slow rank on an even multi-rank CPU run, and
how often it names the real one when there is a straggler.

Any slow-rank verdict a user would see on an even run counts as a false
alarm (issue 26), whichever rank and cause, on both paths a user meets:

- ``steps``: the step-record verdict (``analysis.ranks.slow.slow_rank``) of
  ``torchlens run -- torchrun``, ``torchlens.watch`` and ``%ddp_check
  --profile``: ``torchlens run`` over ``ddp_jobs.py`` (gloo DDP, a
  ``DataLoader``, no code change). Counted: the final verdict (the run
  folder's manifest and report), and the live view's, which recomputes the
  verdict on the growing window: replayed on every prefix of the recorded
  steps (stricter than the live view, which samples it twice a second).
- ``traces``: the profiled-window findings (``analysis.runs.slow_ranks``)
  of ``torchlens report`` on one ``torch.profiler`` trace per rank
  (``make_gloo_run.py``).

``--modes straggler`` runs the same jobs with rank 1's data loading
``--slow-ms`` longer a step, and counts the runs whose verdict names rank 1
with data loading as its cause. ``--keep DIR`` keeps every run's folder;
``--reanalyse DIR`` applies the current rule to folders kept before, so a
change of the rule is measured on the same runs.

    python benchmarks/check_even_runs.py --runs 10 --ranks 2,4 --keep ../even-runs
    python benchmarks/check_even_runs.py --reanalyse ../even-runs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from torchlens.analysis.ranks.slow import slow_rank
from torchlens.formats.run_folder.records import read_steps
from torchlens.frontends.runs.api import load_run

HERE = Path(__file__).resolve().parent
SLOW_RANK = 1
NAMED = re.compile(r"rank (\d+) is the slow rank: (its data loading|its|no measured)")


def _env() -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    e["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), e.get("PYTHONPATH", "")])
    return e


def _verdict(sentence: str) -> tuple[int, str] | None:
    """(rank, 'data' / 'other' / 'none') of a slow-rank sentence, None when it names none."""
    m = NAMED.search(sentence)
    if not m:
        return None
    return int(m.group(1)), {"its data loading": "data", "its": "other"}.get(m.group(2), "none")


def make(path: str, folder: Path, ranks: int, straggler: bool, a: argparse.Namespace) -> str:
    """Run one job into ``folder``; the live lines ``torchlens run`` printed (steps path)."""
    slow = ["--slow-rank", str(SLOW_RANK), "--slow-ms", str(a.slow_ms)] if straggler else []
    if path == "traces":
        subprocess.run([sys.executable, str(HERE / "make_gloo_run.py"), str(folder),
                        "--ranks", str(ranks), "--steps", str(a.trace_steps),
                        *(slow or ["--slow-rank", "-1"])],
                       check=True, capture_output=True, env=_env())
        return ""
    proc = subprocess.run(
        [sys.executable, "-m", "torchlens", "run", "--out", str(folder), "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", str(ranks), str(HERE / "ddp_jobs.py"), "--steps", str(a.steps),
         "--out", str(folder / "job"), *slow],
        capture_output=True, text=True, env=_env(), timeout=600)
    if proc.returncode:
        raise RuntimeError(f"torchlens run exited {proc.returncode}:\n{proc.stdout[-3000:]}"
                           f"{proc.stderr[-3000:]}")
    (folder / "stdout.txt").write_text(proc.stdout)
    return proc.stdout


def judge(path: str, folder: Path) -> dict[str, list[tuple[int, str]]]:
    """The verdicts of the current rule on a kept run: ``final`` (and ``live``,
    every prefix's, on the steps path)."""
    if path == "traces":
        return {"final": [v for f in load_run(str(folder), workers=2).findings()
                          if (v := _verdict(f))]}
    world = json.loads((folder / "manifest.json").read_text())["world_size"]
    recs = [read_steps(str(folder), r) for r in range(world)]
    final = slow_rank(recs).finding.sentence
    live = []
    for k in range(2, max(len(r) for r in recs) + 1):
        v = _verdict(slow_rank([r[:k] for r in recs]).finding.sentence)
        if v and v not in live:
            live.append(v)
    return {"final": [v] if (v := _verdict(final)) else [], "live": live}


def printed(stdout: str) -> list[tuple[int, str]]:
    """The slow-rank verdicts ``torchlens run`` printed while it ran and at the end."""
    return [v for line in stdout.splitlines() if (v := _verdict(line))]


def report(results: list[dict]) -> None:
    """Per path, world size and mode: false alarms on even runs (every view),
    the straggler named with its cause on straggler runs (the final verdict)."""
    for path, ranks, mode in sorted({(r["path"], r["ranks"], r["mode"]) for r in results}):
        rows = [r for r in results if (r["path"], r["ranks"], r["mode"]) == (path, ranks, mode)]
        for view in ("final", "live", "printed") if mode == "even" else ("final",):
            got = [r for r in rows if view in r]
            if not got:
                continue
            if mode == "even":
                bad = [r for r in got if r[view]]
                what = f"false alarms {len(bad)}/{len(got)}"
            else:
                bad = [r for r in got if [tuple(v) for v in r[view]] != [(SLOW_RANK, "data")]]
                what = f"rank {SLOW_RANK} named with data loading {len(got) - len(bad)}/{len(got)}"
            print(f"{path:6s} {ranks} ranks {mode:9s} {view:7s}: {what}", flush=True)
            for r in bad:
                print(f"    {Path(r['folder']).name}: {r[view]}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--ranks", default="2,4", help="world sizes, comma separated")
    p.add_argument("--modes", default="even,straggler")
    p.add_argument("--paths", default="steps,traces")
    p.add_argument("--steps", type=int, default=150, help="steps of the torchlens run job")
    p.add_argument("--trace-steps", type=int, default=8, help="profiled steps per trace")
    p.add_argument("--slow-ms", type=float, default=30.0)
    p.add_argument("--keep", default=None, help="keep every run's folder under this folder")
    p.add_argument("--reanalyse", default=None,
                   help="judge the runs kept under this folder with the current rule")
    a = p.parse_args()
    results: list[dict] = []
    if a.reanalyse:
        for folder in sorted(Path(a.reanalyse).iterdir()):
            path, ranks, mode, _ = folder.name.split("-")
            results.append({"path": path, "ranks": int(ranks[1:]), "mode": mode,
                            "folder": str(folder), **judge(path, folder)})
        report(results)
        return
    keep = Path(a.keep or tempfile.mkdtemp(prefix="even-runs-"))
    keep.mkdir(parents=True, exist_ok=True)
    for i in range(a.runs):
        for path in a.paths.split(","):
            for ranks in (int(x) for x in a.ranks.split(",")):
                for mode in a.modes.split(","):
                    folder = keep / f"{path}-r{ranks}-{mode}-{i:02d}"
                    stdout = make(path, folder, ranks, mode == "straggler", a)
                    out = judge(path, folder)
                    if path == "steps":
                        out["printed"] = printed(stdout)
                    results.append({"path": path, "ranks": ranks, "mode": mode,
                                    "folder": str(folder), **out})
                    print(f"  {folder.name}: {out}", flush=True)
    report(results)
    if not a.keep:
        print(f"(run folders left in {keep})")


if __name__ == "__main__":
    main()
