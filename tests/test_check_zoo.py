"""benchmarks/check_zoo.py scores each view of a zoo run by the finding codes.

The scores are checked on recorded (made-up) views, so the test says whether
the harness judges right, not whether today's torchlens names the zoo's
problems right.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchlens.model.findings import FAILED, INFO, PASSED, WARNING, Figure, Finding

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import check_zoo  # noqa: E402

ANSWERS = check_zoo.load_answers()


def _f(code: str, severity: str = WARNING, rank: int | None = None,
       cause: str | None = None, sentence: str = "") -> dict:
    """A view's finding as ``Finding.to_dict`` gives it, made plain as the harness reads it."""
    figures = (*((Figure("rank", rank),) if rank is not None else ()),
               *((Figure("cause", cause),) if cause else ()))
    return check_zoo.plain(Finding(severity, sentence or code, figures, code=code).to_dict())


def test_every_job_has_its_answer_and_the_zoo_has_the_asked_kinds() -> None:
    files = {p.stem for p in (BENCH / "zoo").glob("*.py") if not p.stem.startswith("_")}
    assert files == set(ANSWERS), files ^ set(ANSWERS)
    problems = [a for a in ANSWERS.values() if a["codes"]]
    assert len(ANSWERS) >= 25 and len(problems) >= 18
    assert {a["nproc"] for a in ANSWERS.values()} >= {2, 4}
    assert {"healthy_hf", "healthy_lightning"} <= set(ANSWERS)


@pytest.mark.parametrize(("job", "findings", "cell"), [
    # the right code, rank and cause, leading
    ("data_straggler", [_f("slow_rank", rank=1, cause="data")], "ok"),
    # right code and rank, the wrong cause
    ("data_straggler", [_f("slow_rank", rank=1, cause="compute")], "wrong"),
    # right code, the other rank
    ("data_straggler", [_f("slow_rank", rank=0, cause="data")], "wrong"),
    # another problem named instead
    ("data_straggler", [_f("memory_creep", rank=1)], "wrong"),
    # a more serious problem leads
    ("data_straggler", [_f("slow_rank", rank=1, cause="data"),
                        _f("failed_rank", FAILED, rank=0)], "wrong"),
    # nothing named: "no slow rank" is a passed slow_rank finding, not a problem
    ("data_straggler", [_f("slow_rank", PASSED), _f("run_ended", INFO)], "missing"),
    # the rank only in the words: right, marked
    ("crash_one", [_f("failed_rank", FAILED, sentence="rank 1 failed: RuntimeError")], "ok*"),
    # any of the answer's codes counts (a checklist names it its own way)
    ("crash_one", [_f("crashed_worker", FAILED, rank=1)], "ok"),
    # a leak on every rank: both ranks named, by one finding a rank or one for both
    ("leak_cache_all", [_f("memory_creep", rank=0), _f("memory_creep", rank=1)], "ok"),
    ("leak_cache_all", [_f("memory_creep", rank=1)], "wrong"),
    ("leak_cache_one", [_f("memory_creep", rank=1)], "ok"),
    # healthy: quiet is right, any problem is a false alarm
    ("healthy_2", [_f("slow_rank", PASSED)], "ok"),
    ("stepup_optimizer", [_f("memory_creep", rank=0)], "wrong"),
])
def test_a_cell_is_scored_by_code_rank_cause_and_lead(job: str, findings: list, cell: str) -> None:
    assert check_zoo.score(ANSWERS[job], findings)[0] == cell


def test_a_view_without_codes_is_not_scored() -> None:
    assert check_zoo.score(ANSWERS["crash_one"], "no codes") == ("no view", "no codes")
    assert check_zoo.score(ANSWERS["crash_one"], None)[0] == "no view"


def test_the_harness_prints_the_table_and_the_last_line(tmp_path: Path) -> None:
    """Two jobs, one problem and one healthy (run twice), from recorded views:
    right, wrong, missing and not scorable cells, and one false alarm."""
    runs = [
        {"job": "data_straggler", "repeat": 0, "views": {
            "manifest": [_f("slow_rank", rank=1, cause="data")],
            "analyze": [_f("slow_rank", rank=0, cause="data")],
            "report": []}},
        {"job": "healthy_2", "repeat": 0, "views": {
            "manifest": [_f("slow_rank", PASSED)], "analyze": [], "report": "no codes"}},
        {"job": "healthy_2", "repeat": 1, "views": {
            "manifest": [], "analyze": [_f("slow_rank", rank=1, cause="data")],
            "report": "no codes"}},
    ]
    recorded = tmp_path / "views.json"
    recorded.write_text(json.dumps({"runs": runs}))
    out = subprocess.run(
        [sys.executable, str(BENCH / "check_zoo.py"), "--only", "data_straggler", "healthy_2",
         "--views-from", str(recorded)], capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    straggler = next(line for line in lines if line.startswith("data_straggler"))
    assert straggler.split()[1:4] == ["ok", "wrong", "(slow_rank"]
    assert "r0/data)" in straggler and straggler.rstrip().endswith("missing")
    quiet, alarm = (line for line in lines if line.startswith("healthy_2"))
    assert "wrong" not in quiet and "no view (no codes)" in quiet
    assert "wrong (slow_rank r1/data)" in alarm
    assert lines[-1] == "zoo: 1 of 3 named; false alarms 1 of 2 healthy runs"


def test_every_view_of_a_crashed_run_names_the_failed_rank_by_its_figures(
        tmp_path: Path, traces_dir: Path) -> None:
    """A run folder whose rank 1 raised, read as ``--reread`` reads it: the
    manifest's ``verdict_ranks``, ``analyze --json`` and the report page's
    ``data-ranks`` each name rank 1 without reading the words."""
    from torchlens.formats.run_folder.manifest import (
        SOURCE_RUN,
        Manifest,
        RankEntry,
        write_manifest,
    )

    run = tmp_path / "crash_one-00"
    boom = "RuntimeError: zoo: rank 1 fails at step 40"
    ranks = []
    for r in (0, 1):
        (run / f"rank{r}").mkdir(parents=True)
        (run / f"rank{r}" / "step00004.pt.trace.json.gz").symlink_to(
            traces_dir / f"sampled_rank-{r}.json.gz")
        ranks.append(RankEntry(rank=r, traces=[f"rank{r}/step00004.pt.trace.json.gz"],
                               state="failed", error=boom if r else "RuntimeError: gloo"))
    write_manifest(str(run), Manifest(
        source=SOURCE_RUN, world_size=2, ranks=ranks, exit_code=1,
        verdict=f"rank 1 failed: {boom}; look at rank 1's log", verdict_code="failed_rank",
        verdict_ranks=[1]))
    views = check_zoo.views_of(run, sys.executable, check_zoo.VIEWS)
    for view in check_zoo.VIEWS:
        assert check_zoo.score(ANSWERS["crash_one"], views[view])[0] == "ok", (view, views[view])


def test_the_watch_says_its_verdict_with_its_ranks_and_the_slow_rank_after_it() -> None:
    """``Watch.findings`` (``LiveStatus.findings``): a creep verdict names the
    ranks the status gives it, and the slow rank's finding follows it; a slow
    rank that is the verdict is said once."""
    from torchlens.analysis.ranks.verdict import LiveStatus

    slow = Finding(WARNING, "rank 1 is slow", (Figure("rank", 1), Figure("cause", "stall")),
                   code="slow_rank")
    creep = LiveStatus(verdict="ranks 0 and 1 grow 1 MiB a step", verdict_code="memory_creep",
                       verdict_ranks=[0, 1], severity=WARNING, slow_rank=1, slow_finding=slow)
    said = [check_zoo.plain(f.to_dict()) for f in creep.findings()]
    assert [(f["code"], f["ranks"]) for f in said] == [("memory_creep", [0, 1]), ("slow_rank", [1])]
    assert check_zoo.score(ANSWERS["leak_cache_all"], said)[0] == "ok"
    only = LiveStatus(verdict=str(slow), verdict_code="slow_rank", verdict_ranks=[1],
                      severity=WARNING, slow_rank=1, slow_finding=slow)
    assert only.findings() == [slow]
    assert LiveStatus().findings() == []


@pytest.mark.timeout(300)
def test_the_watch_view_of_a_real_run_is_scored_on_reread(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A short ``data_straggler`` run under ``torchlens run -- torchrun``, then
    ``--reread`` of its folder: ``torchlens.watch(FOLDER)``'s final state,
    read in its own interpreter, names rank 1 slow for its data, as the
    manifest the run wrote does."""
    monkeypatch.setenv("ZOO_STEPS", "40")
    job = "data_straggler"
    folder = tmp_path / f"{job}-00"
    info = check_zoo.run_job(ANSWERS[job], folder, sys.executable, 200)
    assert info["rc"] == 0 and (folder / "live.jsonl").exists(), (folder / "zoo-stdout.txt").read_text()
    (tmp_path / "views.json").write_text(json.dumps({"runs": [
        {"job": job, "repeat": 0, "folder": str(folder), **info, "views": {}}]}))
    out = subprocess.run(
        [sys.executable, str(BENCH / "check_zoo.py"), "--only", job, "--reread", str(tmp_path),
         "--views", "manifest,watch", "--python", sys.executable],
        capture_output=True, text=True, check=True, env=check_zoo._env()).stdout
    lines = out.strip().splitlines()
    assert lines[0].split()[-1] == "watch"
    assert lines[1].split()[1:] == ["ok", "ok"], out
    assert lines[-1] == "zoo: 2 of 2 named; false alarms 0 of 0 healthy runs"
    watch = json.loads((tmp_path / "views-reread.json").read_text())["runs"][0]["views"]["watch"]
    assert watch[0] == {"code": "slow_rank", "severity": WARNING, "ranks": [1], "cause": "data",
                        "rank_from": "figures"}


def _knobs(call: ast.Call) -> dict:
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def test_each_notebook_function_is_its_job_with_the_same_knobs() -> None:
    """``zoo/_notebook.py``: one function a job, named after it, calling the
    zoo's loop with the knobs the job file gives ``main``; at least five,
    among them a leak on every rank, a data straggler, a collective mismatch,
    a crash on one rank and a healthy twin."""
    tree = ast.parse((BENCH / "zoo" / "_notebook.py").read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert set(functions) == set(check_zoo.notebook_jobs())
    assert {"leak_cache_all", "data_straggler", "collective_mismatch", "crash_one",
            "healthy_2"} <= set(functions) <= set(ANSWERS)
    for name, fn in functions.items():
        job = ast.parse((BENCH / "zoo" / f"{name}.py").read_text())
        main = next(n.value for n in job.body if isinstance(n, ast.Expr)
                    and isinstance(n.value, ast.Call) and getattr(n.value.func, "id", "") == "main")
        train = next(n for n in ast.walk(fn) if isinstance(n, ast.Call)
                     and getattr(n.func, "id", "") == "train")
        assert _knobs(train) == _knobs(main), name


def _line(code: str, severity: str, **details) -> dict:
    return Finding(severity, code, title=code.replace("_", " "), details=details).to_dict()


def test_the_checklist_is_read_by_the_culprits_its_lines_name() -> None:
    """A crashed worker names the rank that failed first (its ``ranks`` list
    every rank that failed), a hang the ranks the others wait for, and the
    rank-memory line's creeps are memory creeps of their ranks."""
    crash = [_line("crashed_worker", FAILED, first=1, ranks=[1, 0]),
             _line("slow_rank", PASSED)]
    said = [p for f in crash for p in check_zoo.checklist_plain(f)]
    assert said[0]["ranks"] == [1]
    assert check_zoo.score(ANSWERS["crash_one"], said)[0] == "ok"
    hang = [_line("hang", FAILED, behind=[1], waiting=[0])]
    assert check_zoo.score(ANSWERS["uneven_inputs"],
                           check_zoo.checklist_plain(hang[0]))[0] == "ok"
    table = [{"rank": 0, "steps": 60}, {"rank": 1, "steps": 60}]
    creep = _line("rank_memory", WARNING, ranks=table, creep=[{"rank": 0}, {"rank": 1}])
    said = check_zoo.checklist_plain(creep)
    assert [(f["code"], f["ranks"]) for f in said] == [("memory_creep", [0]), ("memory_creep", [1])]
    assert check_zoo.score(ANSWERS["leak_cache_all"], said)[0] == "ok"
    # no creep: the line is information, and its per-rank table names no rank
    quiet = check_zoo.checklist_plain(_line("rank_memory", PASSED, ranks=table, creep=[]))
    assert quiet[0]["ranks"] is None
    assert check_zoo.score(ANSWERS["healthy_2"], quiet)[0] == "ok"


def _summary(primary: dict, step_time: list, status: str = "completed") -> dict:
    """The parts of TraceML's final_summary.json the view reads."""
    return {"run_context": {"run": {"status": status}}, "primary_diagnosis": primary,
            "step_time": {"issues": step_time}, "step_memory": {"issues": [
                {"kind": "NO_GPU", "severity": "info", "ranks": []}]},
            "system": {"issues": [{"kind": "HIGH_CPU", "severity": "warn", "ranks": []}]}}


def test_traceml_is_read_from_its_final_summary_by_the_stated_table(tmp_path: Path) -> None:
    """Its primary diagnosis (the culprit from its section's issue of the same
    kind), its step-time issues mapped by ``TRACEML_CODES``, its severity
    deciding what is a problem; host sections not read; a failed run is a
    failed rank naming none. The harness prints ``traceml zoo: ...``."""
    straggler = {"kind": "INPUT_STRAGGLER", "severity": "crit", "section": "step_time",
                 "evidence": {}}
    runs = {
        "data_straggler-00": _summary(straggler, [
            {**straggler, "ranks": [1], "evidence": {"culprit_rank": 1}},
            {"kind": "INPUT_BOUND", "severity": "crit", "ranks": [1]}]),
        "crash_one-00": _summary({"kind": "NO_CLEAR_PERFORMANCE_BOTTLENECK", "severity": "info",
                                  "section": "step_time"},
                                 [{"kind": "BALANCED", "severity": "info", "ranks": [0]}],
                                 status="failed"),
        "healthy_2-00": _summary({"kind": "STRAGGLER", "severity": "warn", "section": "step_time"},
                                 [{"kind": "STRAGGLER", "severity": "warn", "ranks": [0],
                                   "evidence": {"culprit_rank": 0}}]),
        "healthy_2-01": _summary({"kind": "COMPUTE_BOUND", "severity": "info",
                                  "section": "step_time"}, []),
    }
    for name, summary in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "final_summary.json").write_text(json.dumps(summary))
    said = check_zoo.view_traceml(tmp_path / "data_straggler-00")
    assert [(f["code"], f["ranks"], f["cause"]) for f in said] == [
        ("slow_rank", [1], "data"), ("input_bound", [1], None), ("traceml:no_gpu", None, None)]
    assert check_zoo.view_traceml(tmp_path / "nothing") == "no final_summary.json"
    (tmp_path / "views.json").write_text(json.dumps({"runs": [
        {"job": name.rsplit("-", 1)[0], "repeat": int(name[-1]), "folder": str(tmp_path / name),
         "views": {}} for name in runs]}))
    out = subprocess.run(
        [sys.executable, str(BENCH / "check_zoo.py"), "--tool", "traceml", "--reread",
         str(tmp_path), "--only", "data_straggler", "crash_one", "healthy_2"],
        capture_output=True, text=True, check=True).stdout
    lines = out.strip().splitlines()
    cells = {line.split()[0] + (line.split()[1] if line.split()[1].startswith("(") else ""):
             line for line in lines[1:-1]}
    assert cells["data_straggler"].split()[1] == "ok"
    assert "wrong (failed_rank r-)" in cells["crash_one"]
    assert "wrong (slow_rank r0)" in cells["healthy_2(0)"] and "wrong" not in cells["healthy_2(1)"]
    assert lines[-1] == "traceml zoo: 1 of 2 named; false alarms 1 of 2 healthy runs"
