"""How often torchlens names the right problem, rank and cause on the zoo of
broken training jobs (``benchmarks/zoo/``, answers in ``zoo/answers.json``).

Each job runs as a user runs it, ``torchlens run -- torchrun --nproc-per-node
N JOB.py`` (gloo, CPU), into its own run folder under ``--out``; the healthy
jobs ``--repeat-healthy`` times. Every view of the run is then scored
against the job's written answer by the stable finding codes
(``torchlens.model.findings.Finding.code``), never by the words:

- ``manifest``: the run folder's ``manifest.json`` (``verdict_code``, the
  slow rank's finding and the ``memory_creep`` entries). The terminal's
  verdict line (``torchlens run``'s ``verdict:``) prints no code, so the
  manifest the same run wrote stands for it.
- ``analyze``: ``torchlens analyze RUN --json`` (schema 2), its ``findings``.
- ``report``: ``torchlens report RUN``'s HTML, scored by the ``data-code``
  attributes it carries; a page without any is "no codes" (not scorable).

A finding counts as a problem when its severity is ``failed`` or
``warning``. A cell is ``ok`` when a problem with an expected code is present,
names the expected ranks and leads (no more serious problem before it; a
cause, where the answer gives one, must match the finding's ``cause``
figure); ``wrong (what it said)`` when another problem was named, or the
right one with other ranks, cause or not first; ``missing`` when the view
named no problem. A healthy job's cell is ``ok`` when the view names no
problem, else a false alarm. A rank read from the finding's words because
it carries no ``rank`` figure is marked ``*``.

    python benchmarks/check_zoo.py --out ../zoo-runs                # the whole zoo
    python benchmarks/check_zoo.py --only data_straggler healthy_2 --repeat-healthy 3
    python benchmarks/check_zoo.py --views-from ../zoo-runs/views.json   # re-score kept views

The last line is ``zoo: N of M named; false alarms F of H healthy runs``
(M: problem jobs x scored views; H: healthy runs, F of them with a problem
named by at least one view).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paths  # noqa: E402

ZOO = Path(__file__).resolve().parent / "zoo"
ANSWERS = ZOO / "answers.json"
VIEWS = ("manifest", "analyze", "report")
PROBLEM = ("failed", "warning")
_RANK_WORDS = re.compile(r"\branks? (\d+(?:(?:, | and )\d+)*)")


def load_answers(path: Path = ANSWERS) -> dict[str, dict[str, Any]]:
    """The zoo's answers by job name (``answers.json``'s ``jobs``)."""
    return {a["job"]: a for a in json.loads(path.read_text(encoding="utf-8"))["jobs"]}


def healthy(answer: dict[str, Any]) -> bool:
    """Whether the job has no problem planted (its answer names no code)."""
    return not answer.get("codes")


# ---- what each view said, as plain findings: {code, severity, ranks, cause, rank_from}

def _figure(f: dict[str, Any], name: str) -> Any:
    return next((g.get("value") for g in f.get("figures") or () if g.get("name") == name), None)


def plain(f: dict[str, Any]) -> dict[str, Any]:
    """A finding (``Finding.to_dict``'s shape) as what the score reads: its
    code, severity, ranks (from a ``rank``/``ranks`` figure or detail, else
    its words, ``rank_from: "words"``) and its ``cause`` figure."""
    ranks, source = None, "figures"
    for where in (lambda n: _figure(f, n), lambda n: (f.get("details") or {}).get(n)):
        for name in ("ranks", "rank"):
            v = where(name)
            if v is not None and ranks is None:
                ranks = sorted(v) if isinstance(v, list) else [v]
    if ranks is None and "ranks" in f and isinstance(f["ranks"], list):
        ranks = sorted(f["ranks"])
    if ranks is None:
        m = _RANK_WORDS.search(str(f.get("sentence") or ""))
        if m:
            ranks, source = sorted({int(x) for x in re.findall(r"\d+", m.group(1))}), "words"
    return {"code": f.get("code") or "note", "severity": f.get("severity") or "info",
            "ranks": ranks, "cause": _figure(f, "cause") if "cause" not in f else f["cause"],
            "rank_from": source if ranks is not None else None}


def view_manifest(folder: Path) -> list[dict[str, Any]] | None:
    """The manifest's verdict, slow rank and memory creeps, as plain findings."""
    try:
        m = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    out = []
    slow = m.get("slow_rank") or {}
    if slow.get("finding"):
        f = plain(slow["finding"])
        if slow.get("rank") is not None:
            f.update(ranks=[slow["rank"]], rank_from="figures", cause=slow.get("cause"))
        out.append(f)
    for c in m.get("memory_creep") or ():
        out.append({"code": "memory_creep", "severity": "warning", "ranks": [c.get("rank")],
                    "cause": None, "rank_from": "figures"})
    code = m.get("verdict_code")
    if code and not any(f["code"] == code for f in out):
        # the ranks the verdict names (``verdict_ranks``); a manifest written
        # before it was saved names them in its words only (a rank that failed
        # because a peer went away is no answer, so not read from the states)
        found = {"code": code, "severity": "failed", "sentence": m.get("verdict") or ""}
        if m.get("verdict_ranks"):
            found["details"] = {"ranks": m["verdict_ranks"]}
        out.insert(0, plain(found))
    return out


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def view_analyze(folder: Path, python: str) -> list[dict[str, Any]] | None:
    """``torchlens analyze RUN --json``'s findings."""
    p = _run([python, "-m", "torchlens", "analyze", str(folder), "--json"], 300)
    try:
        return [plain(f) for f in json.loads(p.stdout)["findings"]] if p else None
    except (ValueError, KeyError):
        return None


def view_report(folder: Path, python: str) -> list[dict[str, Any]] | str | None:
    """The codes ``torchlens report RUN``'s page carries (``data-code``
    attributes with ``data-severity``, ``data-ranks`` and ``data-cause``), or
    ``"no codes"``."""
    page = folder / "zoo-report.html"
    p = _run([python, "-m", "torchlens", "report", str(folder), "-o", str(page)], 300)
    if not p or not page.exists():
        return None
    html = page.read_text(encoding="utf-8", errors="replace")
    tags = re.findall(r"<[^>]*\bdata-code=\"([\w-]+)\"[^>]*>", html)
    if not tags:
        return "no codes"
    out = []
    for tag in re.finditer(r"<[^>]*\bdata-code=\"([\w-]+)\"[^>]*>", html):
        sev = re.search(r"data-severity=\"([\w ]+)\"", tag.group(0))
        ranks = re.search(r"data-ranks?=\"([\d, ]+)\"", tag.group(0))
        cause = re.search(r"data-cause=\"([\w ]+)\"", tag.group(0))
        out.append({"code": tag.group(1), "severity": sev.group(1) if sev else "info",
                    "ranks": [int(x) for x in re.findall(r"\d+", ranks.group(1))] if ranks else None,
                    "cause": cause.group(1) if cause else None,
                    "rank_from": "figures" if ranks else None})
    return out


# ---- scoring

_ORDER = {s: i for i, s in enumerate(("failed", "warning", "info", "passed", "not applicable"))}


def problems(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings that name a problem, most serious first (ties: as given)."""
    said = [f for f in findings if f["severity"] in PROBLEM]
    return sorted(said, key=lambda f: _ORDER.get(f["severity"], 9))


def _said(f: dict[str, Any]) -> str:
    ranks = ",".join(map(str, f["ranks"])) if f.get("ranks") else "-"
    cause = f"/{f['cause']}" if f.get("cause") else ""
    return f"{f['code']} r{ranks}{cause}"


def score(answer: dict[str, Any], findings: list[dict[str, Any]] | str | None) -> tuple[str, str]:
    """One cell: (``ok`` / ``wrong`` / ``missing`` / ``no view``, what it said)."""
    if findings is None:
        return "no view", "the view gave nothing"
    if isinstance(findings, str):
        return "no view", findings
    said = problems(findings)
    if healthy(answer):
        return ("ok", "") if not said else ("wrong", "; ".join(map(_said, said)))
    if not said:
        return "missing", ""
    codes = answer["codes"]
    matches = [f for f in said if f["code"] in codes]
    what = "; ".join(map(_said, said))
    if not matches:
        return "wrong", what
    # a problem on several ranks may be one finding naming them all or one a rank
    named = sorted({r for f in matches for r in f.get("ranks") or ()})
    want = answer.get("ranks")
    if want is not None and named != sorted(want):
        if not (not named and answer.get("all_ranks_ok")):
            return "wrong", what
    if answer.get("cause") and not any(f.get("cause") == answer["cause"] for f in matches):
        return "wrong", what
    lead, match = said[0], matches[0]
    if lead is not match and _ORDER[lead["severity"]] <= _ORDER[match["severity"]]:
        return "wrong", what
    words = want is not None and any(f.get("rank_from") == "words" for f in matches)
    return ("ok*" if words else "ok"), what

# ---- running

def _env() -> dict[str, str]:
    e = dict(os.environ, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR",
             TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(paths.REPO), e.get("PYTHONPATH")) if p)
    return e


def run_job(answer: dict[str, Any], folder: Path, python: str, timeout: float) -> dict[str, Any]:
    """Run one job under ``torchlens run`` into ``folder``; how it went."""
    cmd = [python, "-m", "torchlens", "run", "--out", str(folder), "--",
           python, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(answer.get("nproc", 2)), str(ZOO / f"{answer['job']}.py")]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(), start_new_session=True)
    killed = False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        killed = True
        os.killpg(proc.pid, 15)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "zoo-stdout.txt").write_text(out or "", encoding="utf-8")
    return {"rc": proc.returncode, "killed": killed, "seconds": round(time.monotonic() - t0, 1)}


def views_of(folder: Path, python: str, wanted: tuple[str, ...]) -> dict[str, Any]:
    """Every wanted view of a run folder, as plain findings."""
    out: dict[str, Any] = {}
    if "manifest" in wanted:
        out["manifest"] = view_manifest(folder)
    if "analyze" in wanted:
        out["analyze"] = view_analyze(folder, python)
    if "report" in wanted:
        out["report"] = view_report(folder, python)
    return out


# ---- the table

def table(answers: dict[str, dict[str, Any]], runs: list[dict[str, Any]],
          views: tuple[str, ...]) -> list[str]:
    """The job x view table and the last line, as printed lines."""
    lines = [f"{'job (run)':32s} " + " ".join(f"{v:28s}" for v in views)]
    named = scored = alarms = healthy_runs = 0
    for r in runs:
        answer = answers[r["job"]]
        cells = []
        alarm = False
        for v in views:
            cell, said = score(answer, r["views"].get(v))
            if cell != "no view":
                if healthy(answer):
                    alarm |= cell == "wrong"
                else:
                    scored += 1
                    named += cell.startswith("ok")
            cells.append(f"{cell} ({said})" if said and cell != "ok" else cell)
        if healthy(answer):
            healthy_runs += 1
            alarms += alarm
        label = f"{r['job']} ({r['repeat']})" if healthy(answer) else r["job"]
        if r.get("killed"):
            label += " [killed]"
        lines.append(f"{label:32s} " + " ".join(f"{c:28s}" for c in cells))
    lines.append(f"zoo: {named} of {scored} named; false alarms {alarms} of {healthy_runs} "
                 "healthy runs")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", metavar="NAME", help="these jobs only")
    p.add_argument("--repeat-healthy", type=int, default=10, help="runs of each healthy job")
    p.add_argument("--python", default=None,
                   help="the interpreter torchlens and the jobs run in (benchmarks/paths.py)")
    p.add_argument("--out", default=None,
                   help="folder for the run folders and views.json (default: a new temporary one)")
    p.add_argument("--views", default=",".join(VIEWS), help="views to score, comma separated")
    p.add_argument("--job-timeout", type=float, default=240,
                   help="seconds before a job is killed (recorded as killed)")
    p.add_argument("--answers", default=str(ANSWERS))
    p.add_argument("--views-from", default=None,
                   help="score the views recorded in this views.json instead of running")
    p.add_argument("--reread", default=None, metavar="DIR",
                   help="read the views again from the run folders of an earlier --out DIR "
                        "(jobs not run again: what a changed analyze or report rule says "
                        "of the same runs; the manifest is the one the run wrote); "
                        "writes DIR/views-reread.json")
    a = p.parse_args(argv)
    answers = load_answers(Path(a.answers))
    views = tuple(v for v in a.views.split(",") if v)
    jobs = a.only or list(answers)
    unknown = [j for j in jobs if j not in answers]
    if unknown:
        p.error(f"no answer for {', '.join(unknown)} in {a.answers}")
    if a.views_from:
        runs = [r for r in json.loads(Path(a.views_from).read_text(encoding="utf-8"))["runs"]
                if r["job"] in jobs]
    elif a.reread:
        python = paths.torchlens_python(a.python)
        base = Path(a.reread)
        runs = [r for r in json.loads((base / "views.json").read_text(encoding="utf-8"))["runs"]
                if r["job"] in jobs]
        for r in runs:
            r["views"] = views_of(Path(r["folder"]), python, views)
        (base / "views-reread.json").write_text(json.dumps({"runs": runs}, indent=1),
                                                encoding="utf-8")
    else:
        python = paths.torchlens_python(a.python)
        out = Path(a.out) if a.out else paths.scratch("zoo")
        out.mkdir(parents=True, exist_ok=True)
        runs = []
        for job in jobs:
            answer = answers[job]
            for i in range(a.repeat_healthy if healthy(answer) else 1):
                folder = out / f"{job}-{i:02d}"
                info = run_job(answer, folder, python, a.job_timeout)
                r = {"job": job, "repeat": i, "folder": str(folder), **info,
                     "views": views_of(folder, python, views)}
                runs.append(r)
                print(f"  {folder.name}: exit {info['rc']}{' killed' if info['killed'] else ''}"
                      f" in {info['seconds']} s", flush=True)
                (out / "views.json").write_text(json.dumps({"runs": runs}, indent=1),
                                                encoding="utf-8")
        print(f"(run folders and views.json in {out})")
    for line in table(answers, runs, views):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
