"""A ``torchlens run`` folder whose ``manifest.json`` is damaged (cut
short, or garbage written into it): ``torchlens report`` says so on the
terminal, not only inside the HTML; the report says what the manifest held
that it cannot show (not "the other ranks were analysed": the manifest is no
rank); and the step records, which do not need the manifest, still draw
"Every step over time" and judge the slow rank.

Exit status: 0, as for any folder that is partly readable (``torchlens
analyze`` too); 2 only when nothing could be read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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

STEPS = 30


def _record(rank: int, i: int) -> StepRecord:
    data = 0.05 if rank == 1 else 0.0001  # rank 1 loads its data slowly
    t0 = 1000.0 + i * 0.06
    return StepRecord(step=i, t0=t0, t1=t0 + 0.055,
                      phases={"data": data, "forward": 0.001, "backward": 0.002,
                              "optimizer": 0.001, "collective": 0.051 - data})


@pytest.fixture
def run(tmp_path: Path, traces_dir: Path) -> Path:
    """A two-rank ``torchlens run`` folder that ended well, then its manifest cut."""
    out = tmp_path / "run"
    ranks = []
    for r in (0, 1):
        (out / f"rank{r}").mkdir(parents=True)
        (out / f"rank{r}" / "step00004.pt.trace.json.gz").symlink_to(
            traces_dir / f"sampled_rank-{r}.json.gz")
        write_steps(str(out), r, [_record(r, i) for i in range(STEPS)])
        ranks.append(RankEntry(rank=r, traces=[f"rank{r}/step00004.pt.trace.json.gz"],
                               state="finished", steps=STEPS))
    write_manifest(str(out), Manifest(
        source=SOURCE_RUN, world_size=2, ranks=ranks, started=999.0, exit_code=0,
        stopped="finished: every rank said goodbye (30 steps or more each)"))
    manifest = out / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:200])  # cut short mid-way
    return out


def test_the_terminal_names_the_damaged_manifest_and_what_was_lost(run: Path, tmp_path: Path,
                                                                   capsys) -> None:
    out = tmp_path / "damaged.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "manifest.json" in line]
    assert len(said) == 1, err
    assert "not valid JSON" in said[0]
    assert "how the run ended" in said[0]  # what is not shown
    # every problem the loader recorded, one line each: the sampled traces say
    # world size 128, so the ranks beyond 0-1 are named missing
    assert any("missing rank" in line and "ranks 2-127" in line for line in err.splitlines())


def test_the_report_says_what_the_manifest_held_not_that_other_ranks_were_read(
        run: Path, tmp_path: Path) -> None:
    out = tmp_path / "damaged.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8").replace("&#39;", "'").replace("&#x27;", "'")
    assert "the other ranks were analysed" not in page
    assert "manifest.json could not be read" in page
    assert "not shown: how the run ended" in page


def test_the_step_records_still_draw_every_step_and_judge_the_slow_rank(
        run: Path, tmp_path: Path) -> None:
    res = load_run(str(run), workers=1)
    assert res.slow_rank() is not None and res.slow_rank().rank == 1
    out = tmp_path / "damaged.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert "Every step over time" in page
    # the verdict is the step records' (every step), not the three profiled steps' one
    said = page.split("slow rank</b>:", 1)[1][:300]
    assert "rank 1 is the slow rank" in said and "(last in 20 of the last 20 steps)" in said
    assert f"{2 * STEPS} step records of 2 ranks" in page
    # no manifest, no collector start: the chart's zero is the first step, and says so
    assert "s since the first step began" in page


def test_analyze_and_report_say_the_damaged_manifest_once(run: Path, tmp_path: Path,
                                                          capsys) -> None:
    """The sentence was printed twice by analyze (as an input problem, then as
    the finding with the same words) and shown twice in the report."""
    assert main(["analyze", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.count("manifest.json could not be read") == 1, out
    assert "not shown: how the run ended" in out
    # the other problems are still listed, each on its own line with its file
    assert "missing rank" in out
    page_path = tmp_path / "damaged.html"
    assert main(["report", str(run), "-o", str(page_path)]) == 0
    capsys.readouterr()
    page = page_path.read_text(encoding="utf-8")
    assert page.count("manifest.json could not be read") == 1
