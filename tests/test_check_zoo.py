"""benchmarks/check_zoo.py scores each view of a zoo run by the finding codes.

The scores are checked on recorded (made-up) views, so the test says whether
the harness judges right, not whether today's torchlens names the zoo's
problems right.
"""

from __future__ import annotations

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
