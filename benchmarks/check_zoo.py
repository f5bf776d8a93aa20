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
- ``watch``: ``torchlens.watch(RUN)`` on the ended run, as a notebook user
  calls it (the object, not its pixels), in a fresh interpreter: its typed
  ``findings``, the final verdict the status block shows (with its ranks)
  and the slow rank's finding when the verdict is another.

Two more ways to run the same zoo, each scored the same way:

- ``--views ddp_check``: the jobs ``zoo/_notebook.py`` writes as notebook
  functions, each run as ``torchlens.ddp_check(fn, profile=True)`` in a fresh
  interpreter (spawned ranks, no torchrun); its checklist is the view.
- ``--tool traceml``: every job under TraceML's own launcher (``traceml run``,
  in the peers' venv ``scripts/bench-env --only base,traceml`` makes), its
  ``final_summary.json`` read and its kinds mapped by ``TRACEML_CODES``
  (docs/ZOO.md "TraceML on the same zoo"); the last line starts ``traceml``.

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
    python benchmarks/check_zoo.py --views ddp_check --repeat-healthy 2  # notebook functions
    nice -n 10 python benchmarks/check_zoo.py --tool traceml --repeat-healthy 2 --out DIR

The last line is ``zoo: N of M named; false alarms F of H healthy runs``
(M: problem jobs x scored views; H: healthy runs, F of them with a problem
named by at least one view).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paths  # noqa: E402

ZOO = Path(__file__).resolve().parent / "zoo"
ANSWERS = ZOO / "answers.json"
VIEWS = ("manifest", "analyze", "report", "watch")
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
            if isinstance(v, int) and not isinstance(v, bool):
                v = [v]
            # a list of rank numbers (a checklist's per-rank table is not one)
            if isinstance(v, list) and all(isinstance(r, int) for r in v) and ranks is None:
                ranks = sorted(v)
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
    lead = next((f for f in out if f["code"] == code), None) if code else None
    if lead is not None:  # the verdict leads, as the terminal's verdict line says it
        out.remove(lead)
        out.insert(0, lead)
    if code and lead is None:
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


#: what the watch view runs: ``torchlens.watch(FOLDER)`` as a notebook user
#: calls it, waited for until the run's feed ends, its typed findings as JSON
_WATCH = """
import json, sys, torchlens
w = torchlens.watch(sys.argv[1], timeout=float(sys.argv[2]))
w.wait(float(sys.argv[2]) * 4)
w.stop()
said = None if w.status is None else [f.to_dict() for f in w.findings]
json.dump({"state": w.state, "message": w.message, "findings": said}, sys.stdout,
          default=lambda v: v.item() if hasattr(v, "item") else str(v))
"""


def view_watch(folder: Path, python: str, timeout: float = 20) -> list[dict[str, Any]] | str | None:
    """What ``torchlens.watch(FOLDER)`` shows once the ended run's feed is
    read (``Watch.findings``: its final verdict, then the slow rank's finding
    when it is another), in a fresh interpreter; ``"watch stopped: why"``
    when it ended with no status to show."""
    p = _run([python, "-c", _WATCH, str(folder), str(timeout)], timeout * 6)
    try:
        said = json.loads(p.stdout) if p else None
    except ValueError:
        return None
    if said is None:
        return None
    if said["findings"] is None:
        return f"watch {said['state']}: {said['message'] or 'no status'}"
    return [plain(f) for f in said["findings"]]


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


# ---- %ddp_check --profile on the zoo's notebook functions (--views ddp_check)

#: what the ddp_check view runs: ``torchlens.ddp_check(fn, profile=True)`` as a
#: notebook user calls it, on ``zoo/_notebook.py``'s function for the job;
#: the checklist, as ``Finding.to_dict``, into ``FOLDER/zoo-checklist.json``
_DDP_CHECK = """
import json, sys, time
import torchlens
import _notebook
job, folder, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.monotonic()
r = torchlens.ddp_check(_notebook.FUNCTIONS[job], world_size=world, profile=True,
                        run_dir=folder + "/run", live=False, show=False)
with open(folder + "/zoo-checklist.json", "w") as f:
    json.dump({"checklist": [i.to_dict() for i in r.checklist], "ok": r.ok,
               "seconds": round(time.monotonic() - t0, 1)}, f,
              default=lambda v: v.item() if hasattr(v, "item") else str(v))
"""


def notebook_jobs() -> list[str]:
    """The jobs ``zoo/_notebook.py`` has a function for (its top-level functions)."""
    tree = ast.parse((ZOO / "_notebook.py").read_text(encoding="utf-8"))
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]


def run_function(answer: dict[str, Any], folder: Path, python: str,
                 timeout: float) -> dict[str, Any]:
    """Run the job's notebook function under ``%ddp_check --profile`` (spawned
    ranks, no torchrun) in a fresh interpreter; its checklist into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    env = _env()
    # the spawned ranks unpickle the function by its module: they import it from the zoo
    env["PYTHONPATH"] = os.pathsep.join((str(ZOO), env["PYTHONPATH"]))
    cmd = [python, "-c", _DDP_CHECK, answer["job"], str(folder), str(answer.get("nproc", 2))]
    return _launch(cmd, folder, timeout, env)


def checklist_plain(f: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``%ddp_check`` checklist line as plain findings, its ranks from the
    line's own fields where it names the culprit there: a crashed worker's
    ``first`` (the rank that failed first; ``ranks`` lists every rank that
    failed after it too), a hang's ``behind`` (the ranks the others wait for),
    and the rank-memory line's ``creep`` entries, each a ``memory_creep`` of
    its rank (as the manifest view reads the manifest's creeps)."""
    details = f.get("details") or {}
    if f.get("code") == "rank_memory" and details.get("creep"):
        return [{"code": "memory_creep", "severity": f.get("severity") or "warning",
                 "ranks": [c.get("rank")], "cause": None, "rank_from": "figures"}
                for c in details["creep"]]
    out = plain(f)
    named = {"crashed_worker": details.get("first"), "hang": details.get("behind")}.get(
        str(f.get("code")))
    if isinstance(named, int) and not isinstance(named, bool):
        named = [named]
    if isinstance(named, list) and named:
        out.update(ranks=sorted(named), rank_from="figures")
    return [out]


def view_ddp_check(folder: Path) -> list[dict[str, Any]] | None:
    """The checklist ``%ddp_check --profile`` gave (``zoo-checklist.json``), as
    plain findings in its order; None when the check left none."""
    try:
        said = json.loads((folder / "zoo-checklist.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return [p for f in said["checklist"] for p in checklist_plain(f)]


# ---- TraceML on the same zoo (--tool traceml)

#: the zoo jobs TraceML instruments by itself (its Trainer and Lightning
#: integrations): run as they are, not through ``zoo/_traceml.py``
TRACEML_OWN = ("healthy_hf", "healthy_lightning")
#: TraceML's diagnosis kinds (``final_summary.json``) as the zoo's codes, with
#: the cause a kind says; a kind not here keeps its own name (``traceml:KIND``)
#: and counts as a problem when TraceML's severity says so. Zoo codes no
#: TraceML kind names: failed_rank/crashed_worker, uneven_inputs/hang,
#: collective_mismatch/collective_sequence, parameter_sync, small_buckets,
#: accumulation_sync, slow_steps; causes stall, checkpoint, evaluation, gc,
#: cpu_contention (docs/ZOO.md)
TRACEML_CODES: dict[str, tuple[str, str | None]] = {
    "STRAGGLER": ("slow_rank", None),
    "INPUT_STRAGGLER": ("slow_rank", "data"),
    "COMPUTE_STRAGGLER": ("slow_rank", "compute"),
    "H2D_STRAGGLER": ("slow_rank", "h2d"),
    "INPUT_BOUND": ("input_bound", None),
    "CREEP_CONFIRMED": ("memory_creep", None),
    "CREEP_EARLY": ("memory_creep", None),
}
#: TraceML's severities as the zoo's
TRACEML_SEVERITY = {"crit": "failed", "critical": "failed", "warn": "warning",
                    "warning": "warning"}
#: the sections of its final summary whose issue lists are read: the training
#: step's time and memory (system and process are host health: not scored)
TRACEML_SECTIONS = ("step_time", "step_memory")


def traceml_plain(issue: dict[str, Any]) -> dict[str, Any]:
    """One TraceML diagnosis (``primary_diagnosis`` or an issue) as a plain
    finding: its kind by ``TRACEML_CODES``, its severity, its culprit rank
    (``evidence.culprit_rank``, else its ``ranks``)."""
    kind = str(issue.get("kind") or "")
    code, cause = TRACEML_CODES.get(kind, (f"traceml:{kind.lower()}", None))
    culprit = (issue.get("evidence") or {}).get("culprit_rank")
    ranks = [culprit] if isinstance(culprit, int) else (
        sorted(r for r in issue.get("ranks") or () if isinstance(r, int)) or None)
    return {"code": code, "severity": TRACEML_SEVERITY.get(str(issue.get("severity")), "info"),
            "ranks": ranks, "cause": cause, "rank_from": "figures" if ranks else None,
            "kind": kind}


def view_traceml(folder: Path) -> list[dict[str, Any]] | str:
    """TraceML's own diagnosis from its ``final_summary.json``: a failed run
    (``run_context.run.status``: ``failed_rank`` naming no rank), the primary
    diagnosis, then the issue lists of ``TRACEML_SECTIONS`` (the primary's
    copy left out); ``"no final_summary.json"`` when it wrote none."""
    try:
        summary = json.loads((folder / "final_summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no final_summary.json"
    out = []
    run = ((summary.get("run_context") or {}).get("run") or {}).get("status")
    if run == "failed":  # its launcher saw the job fail; no rank is said
        out.append({"code": "failed_rank", "severity": "failed", "ranks": None, "cause": None,
                    "rank_from": None, "kind": "run failed"})
    primary = summary.get("primary_diagnosis") or {}
    # the primary is promoted from its section's issue of the same kind: that
    # issue names the culprit rank when the primary's evidence does not
    copy = next((i for i in (summary.get(primary.get("section")) or {}).get("issues") or ()
                 if i.get("kind") == primary.get("kind")), None) if primary.get("kind") else None
    if primary.get("kind"):
        lead = traceml_plain(primary)
        if lead["ranks"] is None and copy is not None:
            lead.update({k: v for k, v in traceml_plain(copy).items()
                         if k in ("ranks", "rank_from")})
        out.append(lead)
    for section in TRACEML_SECTIONS:
        out += [traceml_plain(i) for i in (summary.get(section) or {}).get("issues") or ()
                if i is not copy]
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
    return _launch(cmd, folder, timeout, _env())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_job_traceml(answer: dict[str, Any], folder: Path, python: str,
                    timeout: float) -> dict[str, Any]:
    """Run one job under TraceML's launcher (``traceml run``, ``--mode summary``),
    its logs in ``folder`` (``--logs-dir`` its parent, ``--run-name`` its name);
    a plain loop through ``zoo/_traceml.py`` (``traceml.init`` and
    ``trace_step`` from outside), a job TraceML instruments itself directly."""
    job = ZOO / f"{answer['job']}.py"
    script = [str(job)] if answer["job"] in TRACEML_OWN else [str(ZOO / "_traceml.py")]
    cmd = [str(Path(python).with_name("traceml")), "run", script[0],
           "--nproc-per-node", str(answer.get("nproc", 2)), "--mode", "summary",
           "--logs-dir", str(folder.parent), "--run-name", folder.name,
           "--master-port", str(_free_port()), "--aggregator-port", str(_free_port())]
    if answer["job"] not in TRACEML_OWN:
        cmd += ["--args", str(job)]
    env = _env()
    env.pop("PYTHONPATH", None)  # the peers' venv, as its users run it
    return _launch(cmd, folder, timeout, env)


def _busy_s() -> float | None:
    """Seconds every CPU of this machine has been busy since boot (Linux's
    /proc/stat), None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal: all but idle and iowait
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _launch(cmd: list[str], folder: Path, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd`` (killed, its whole session, after ``timeout`` s); its output
    into ``folder/zoo-stdout.txt``; how it went, with ``others_cores``: the
    CPUs other processes kept busy meanwhile (the machine's busy time less the
    job's own, over its wall time), the load a verdict was made under."""
    busy0, own0 = _busy_s(), _children_cpu_s()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
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
    wall = time.monotonic() - t0
    busy1, own1 = _busy_s(), _children_cpu_s()
    others = (None if busy0 is None or busy1 is None
              else round(max(0.0, (busy1 - busy0) - (own1 - own0)) / max(wall, 1e-3), 2))
    (folder / "zoo-stdout.txt").write_text(out or "", encoding="utf-8")
    return {"rc": proc.returncode, "killed": killed, "seconds": round(wall, 1),
            "others_cores": others}


def views_of(folder: Path, python: str, wanted: tuple[str, ...]) -> dict[str, Any]:
    """Every wanted view of a run folder, as plain findings."""
    out: dict[str, Any] = {}
    if "manifest" in wanted:
        out["manifest"] = view_manifest(folder)
    if "analyze" in wanted:
        out["analyze"] = view_analyze(folder, python)
    if "report" in wanted:
        out["report"] = view_report(folder, python)
    if "watch" in wanted:
        out["watch"] = view_watch(folder, python)
    return out


# ---- the table

def table(answers: dict[str, dict[str, Any]], runs: list[dict[str, Any]],
          views: tuple[str, ...], tool: str = "torchlens") -> list[str]:
    """The job x view table and the last line, as printed lines (a peer's last
    line starts with its name: ``traceml zoo: ...``)."""
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
    loads = sorted(r["others_cores"] for r in runs if r.get("others_cores") is not None)
    if loads:  # what else ran: a verdict on a loaded machine is made under contention
        lines.append(f"other processes during the jobs: {median(loads)} CPUs busy (median), "
                     f"{loads[-1]} at most, of {os.cpu_count()}")
    lines.append(f"{'' if tool == 'torchlens' else tool + ' '}zoo: {named} of {scored} named; "
                 f"false alarms {alarms} of {healthy_runs} healthy runs")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", metavar="NAME",
                   help="these jobs only (a job named twice runs twice)")
    p.add_argument("--repeat-healthy", type=int, default=10, help="runs of each healthy job")
    p.add_argument("--python", default=None,
                   help="the interpreter torchlens and the jobs run in (benchmarks/paths.py)")
    p.add_argument("--out", default=None,
                   help="folder for the run folders and views.json (default: a new temporary one)")
    p.add_argument("--tool", choices=("torchlens", "traceml"), default="torchlens",
                   help="traceml: run each job under TraceML's launcher in the peers' venv "
                        "(scripts/bench-env --only base,traceml) and score its own diagnosis")
    p.add_argument("--peer-python", default=None,
                   help="--tool traceml: the Python with TraceML (default: "
                        "$TORCHLENS_BENCH_PYTHON, else .bench-venv's; benchmarks/paths.py)")
    p.add_argument("--views", default=None,
                   help=f"views to score, comma separated (default: {','.join(VIEWS)}; with "
                        "--views-from, those it recorded)")
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
    traceml = a.tool == "traceml"
    views = ("traceml",) if traceml else tuple(
        v for v in (a.views or ",".join(VIEWS)).split(",") if v)
    if traceml:
        python = paths.peer_python(a.peer_python)
        if not a.views_from and not a.reread and not Path(python).with_name("traceml").exists():
            print(f"TraceML is not installed beside {python}: make the peers' venv with "
                  "scripts/bench-env --only base,traceml, or name one with --peer-python",
                  file=sys.stderr)
            return 2
    functions = "ddp_check" in views
    if functions and len(views) > 1:
        p.error("--views ddp_check runs the notebook functions, not the jobs: score it alone")
    jobs = a.only or (notebook_jobs() if functions else list(answers))
    unknown = [j for j in jobs if j not in answers]
    if unknown:
        p.error(f"no answer for {', '.join(unknown)} in {a.answers}")
    if functions and not a.views_from:
        unknown = [j for j in jobs if j not in notebook_jobs()]
        if unknown:
            p.error(f"no notebook function for {', '.join(unknown)} in zoo/_notebook.py")
    if a.views_from:
        runs = [r for r in json.loads(Path(a.views_from).read_text(encoding="utf-8"))["runs"]
                if r["job"] in jobs]
        if a.views is None:  # a record made before a view was added scores as it did
            held = {v for r in runs for v in r["views"]}
            views = tuple(v for v in views if v in held) or views
    elif a.reread:
        python = python if traceml else paths.torchlens_python(a.python)
        base = Path(a.reread)
        runs = [r for r in json.loads((base / "views.json").read_text(encoding="utf-8"))["runs"]
                if r["job"] in jobs]
        for r in runs:
            r["views"] = ({"traceml": view_traceml(Path(r["folder"]))} if traceml
                          else {"ddp_check": view_ddp_check(Path(r["folder"]))} if functions
                          else views_of(Path(r["folder"]), python, views))
        (base / "views-reread.json").write_text(json.dumps({"runs": runs}, indent=1),
                                                encoding="utf-8")
    else:
        python = python if traceml else paths.torchlens_python(a.python)
        out = Path(a.out) if a.out else paths.scratch("zoo")
        out.mkdir(parents=True, exist_ok=True)
        runs = []
        for job in jobs:
            answer = answers[job]
            before = sum(r["job"] == job for r in runs)  # a job named twice in --only
            for i in range(before, before + (a.repeat_healthy if healthy(answer) else 1)):
                folder = out / f"{job}-{i:02d}"
                if traceml:
                    info = run_job_traceml(answer, folder, python, a.job_timeout)
                    said = {"traceml": view_traceml(folder)}
                elif functions:
                    info = run_function(answer, folder, python, a.job_timeout)
                    said = {"ddp_check": view_ddp_check(folder)}
                else:
                    info = run_job(answer, folder, python, a.job_timeout)
                    said = views_of(folder, python, views)
                r = {"job": job, "repeat": i, "folder": str(folder), **info, "views": said}
                runs.append(r)
                load = info.get("others_cores")
                print(f"  {folder.name}: exit {info['rc']}{' killed' if info['killed'] else ''}"
                      f" in {info['seconds']} s"
                      + (f", other processes busy on {load} of {os.cpu_count()} CPUs"
                         if load is not None else ""), flush=True)
                (out / "views.json").write_text(json.dumps({"runs": runs}, indent=1),
                                                encoding="utf-8")
        print(f"(run folders and views.json in {out})")
    for line in table(answers, runs, views, a.tool):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
