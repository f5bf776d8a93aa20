"""A run folder whose step records were cut short (a crash mid-write, a copy cut
off): the readable records are used and the damaged lines are named in the
report, not skipped silently (a cut ``steps.jsonl`` gave exit 0
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
from torchlens.frontends.cli.main import main
from torchlens.frontends.runs.api import load_run
from torchlens.model.records import StepRecord


def test_cut_step_records_are_named_in_the_report(tmp_path: Path, traces_dir: Path,
                                                   capsys) -> None:
    run = _run_folder(tmp_path, traces_dir, 6)
    steps = run / "rank1" / "steps.jsonl"
    steps.write_bytes(steps.read_bytes()[:-25])  # the last record cut mid-line
    assert len(read_steps(str(run), 1)) == 5
    res = load_run(str(run))
    said = [p for p in res.problems if p.path == str(steps)]
    assert [p.kind for p in said] == ["truncated"]
    assert "rank 1's step records: 1 line(s) could not be read" in said[0].message
    assert not [p for p in res.problems if "rank0" in p.path and "steps" in p.path]
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "rank 1&#39;s step records: 1 line(s) could not be read" in page \
        or "rank 1's step records: 1 line(s) could not be read" in page


def _run_folder(tmp_path: Path, traces_dir: Path, steps: int) -> Path:
    """A two-rank torchlens run folder whose manifest says each rank sent ``steps``."""
    run = tmp_path / "run"
    ranks = []
    for r in (0, 1):
        (run / f"rank{r}").mkdir(parents=True)
        (run / f"rank{r}" / "step00004.pt.trace.json.gz").symlink_to(
            traces_dir / f"sampled_rank-{r}.json.gz")
        write_steps(str(run), r, [StepRecord(step=i, t0=i, t1=i + 0.5) for i in range(steps)])
        ranks.append(RankEntry(rank=r, traces=[f"rank{r}/step00004.pt.trace.json.gz"],
                               steps=steps))
    write_manifest(str(run), Manifest(source=SOURCE_RUN, world_size=128, ranks=ranks))
    return run


def test_step_records_cut_short_say_how_many_are_missing(tmp_path: Path, traces_dir: Path,
                                                          capsys) -> None:
    # a steps.jsonl cut to 22 of its 60 lines said
    # "1 line(s) ... were left out" while 38 records were gone
    run = _run_folder(tmp_path, traces_dir, 60)
    steps = run / "rank1" / "steps.jsonl"
    lines = steps.read_bytes().splitlines(keepends=True)
    steps.write_bytes(b"".join(lines[:21]) + lines[21][:10])  # 21 whole, one cut
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    err = capsys.readouterr().err
    assert ("rank 1's step records: 1 line(s) could not be read (cut short or damaged); "
            "38 of the 60 the collector got are not in the file (cut short?); its steps are "
            "the 21 that could be read") in err, err
    assert "rank 0's step records" not in err


def test_a_deleted_manifest_is_named_and_the_steps_still_drawn(tmp_path: Path,
                                                                traces_dir: Path,
                                                                capsys) -> None:
    run = _run_folder(tmp_path, traces_dir, 12)
    (run / "manifest.json").unlink()
    assert main(["report", str(run), "-o", str(tmp_path / "r.html")]) == 0
    err = capsys.readouterr().err
    assert ("manifest.json is missing: the run was cut off (the process that writes it at the "
            "end, torchlens run or a %ddp_check kernel, died first) or it was deleted; not "
            "shown: how the run ended") in err
    page = (tmp_path / "r.html").read_text()
    assert "manifest.json is missing: the run was cut off" in page
    assert "Every step over time" in page


def test_a_linked_step_file_is_named_refused_not_cut_short(tmp_path: Path, traces_dir: Path,
                                                           capsys) -> None:
    # a steps.jsonl replaced by a link out of the run folder was called "truncated
    # ... (cut short?)" while the guarded open had refused it for being a link
    run = _run_folder(tmp_path, traces_dir, 6)
    steps = run / "rank1" / "steps.jsonl"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "steps.jsonl").write_bytes(steps.read_bytes())
    steps.unlink()
    steps.symlink_to(elsewhere / "steps.jsonl")
    for command in (["analyze", str(run)], ["report", str(run), "-o", str(tmp_path / "r.html")]):
        assert main(command) == 0
        said = capsys.readouterr()
        text = said.out + said.err
        line = next(x for x in text.splitlines() if "rank1/steps.jsonl" in x)
        assert "refused: a link to " in line and "outside the run folder" in line, line
        assert f"TORCHLENS_LINK_TARGETS={elsewhere}" in line, line
        assert "rank 1's step records were not read" in line, line
        assert "truncated" not in text and "cut short" not in text, text
