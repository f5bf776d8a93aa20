"""A run folder whose step records name one slow rank (rank 1, slow data
loading over every step) while its few profiled traces show another rank
arriving last at every collective (rank 2): the report gives one slow rank,
the verdict's; the arrivals table is labelled as its evidence with its
window, and no row gives the verdict's rank a second wait figure."""

from __future__ import annotations

from pathlib import Path

from tests.runs.test_collectives import _write_run
from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    Manifest,
    RankEntry,
    write_manifest,
)
from torchlens.formats.run_folder.records import write_steps
from torchlens.frontends.cli.main import main
from torchlens.frontends.runs.api import load_run
from torchlens.model.records import StepRecord

WORLD, STEPS = 4, 30


def _rec(rank: int, i: int) -> StepRecord:
    """60 ms steps; rank 1 loads data for 40 ms, which the others wait for in backward."""
    t0 = i * 0.1
    data, backward = (0.040, 0.005) if rank == 1 else (0.001, 0.044)
    return StepRecord.from_dict({
        "step": i, "t0": t0, "t1": t0 + 0.060,
        "phases": {"data": data, "forward": 0.010, "backward": backward, "optimizer": 0.005,
                   "collective": 0.0}})


def _folder(tmp_path: Path) -> Path:
    run = _write_run(tmp_path / "run", world=WORLD, late_rank=2)  # arrivals: rank 2 late
    for r in range(WORLD):
        write_steps(str(run), r, [_rec(r, i) for i in range(STEPS)])
    write_manifest(str(run), Manifest(
        source=SOURCE_RUN, world_size=WORLD,
        ranks=[RankEntry(rank=r, traces=[f"rank{r}.json"], steps=STEPS) for r in range(WORLD)]))
    return run


def test_the_report_names_the_verdicts_slow_rank_alone(tmp_path: Path) -> None:
    run = load_run(str(_folder(tmp_path)), workers=1)
    verdict = run.slow_rank()
    assert verdict.rank == 1  # the step records' rule
    slow = [f for f in run.findings() if f.code == "slow_rank"]
    assert len(slow) == 1 and slow[0].finding.value("rank") == 1
    assert not any("rank 2 is the slow rank" in f for f in run.findings())
    # the arrivals still show rank 2 last, as evidence, with no cause and no verdict
    rows = run.stragglers().set_index("rank")
    assert rows.loc[2, "last"] == 8 and rows["cause_words"].drop(index=1).isna().all()
    # one wait figure for the verdict's rank: the verdict's, per step over its steps
    wait = verdict.finding.value("wait_per_step_ms")
    assert rows.loc[1, "wait_per_step_us"] == wait * 1e3
    assert rows.loc[1, ["caused_mean_us", "caused_each_us"]].isna().all()
    note = run.analysis().evidence["stragglers"]
    assert "evidence for the verdict above (rank 1" in note and f"over {verdict.steps} steps" in note
    assert "the collectives in the traces" in note


def test_the_report_page_says_the_tables_window_and_role(tmp_path: Path) -> None:
    run = _folder(tmp_path)
    out = tmp_path / "run.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    section = page.split("Who the others waited for", 1)[1].split("</section>", 1)[0]
    assert "Window and role: evidence for the verdict above (rank 1" in section
