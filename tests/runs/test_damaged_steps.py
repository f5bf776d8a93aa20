"""A run folder whose step records were cut short (a crash mid-write, a copy cut
off): the readable records are used and the damaged lines are named in the
report, not skipped silently (issue 23's walk: a cut ``steps.jsonl`` gave exit 0
and no word of it)."""

from __future__ import annotations

from pathlib import Path

from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    Manifest,
    RankEntry,
    write_manifest,
)
from torchlens.formats.run_folder.records import read_steps, write_steps
from torchlens.frontends.cli import main
from torchlens.frontends.runs.api import load_run
from torchlens.model.records import StepRecord


def test_cut_step_records_are_named_in_the_report(tmp_path: Path, traces_dir: Path,
                                                   capsys) -> None:
    run = tmp_path / "run"
    ranks = []
    for r in (0, 1):
        (run / f"rank{r}").mkdir(parents=True)
        (run / f"rank{r}" / "step00004.pt.trace.json.gz").symlink_to(
            traces_dir / f"sampled_rank-{r}.json.gz")
        write_steps(str(run), r, [StepRecord(step=i, t0=i, t1=i + 0.5) for i in range(6)])
        ranks.append(RankEntry(rank=r, traces=[f"rank{r}/step00004.pt.trace.json.gz"]))
    write_manifest(str(run), Manifest(source=SOURCE_RUN, world_size=128, ranks=ranks))
    steps = run / "rank1" / "steps.jsonl"
    steps.write_bytes(steps.read_bytes()[:-25])  # the last record cut mid-line
    assert len(read_steps(str(run), 1)) == 5
    res = load_run(str(run))
    said = [p for p in res.problems if p.path == str(steps)]
    assert [p.kind for p in said] == ["truncated"]
    assert "1 line(s) of rank 1's step records could not be read" in said[0].message
    assert not [p for p in res.problems if "rank0" in p.path and "steps" in p.path]
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    assert "rank 1&#39;s step records could not be read" in (tmp_path / "r.html").read_text() \
        or "rank 1's step records could not be read" in (tmp_path / "r.html").read_text()
