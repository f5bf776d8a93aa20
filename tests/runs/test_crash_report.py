"""The report of a ``torchlens run`` folder where a rank raised: the headline
says the failure in words, and the failure is the first finding, tagged
``[failed]`` in the failed colour (not a plain black note under a green
"passed")."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchlens.analysis.ranks.collector_notes import collector_notes
from torchlens.formats.run_folder.manifest import (
    SOURCE_RUN,
    Manifest,
    RankEntry,
    write_manifest,
)
from torchlens.frontends import kinds
from torchlens.frontends.cli.main import main
from torchlens.frontends.runs.api import load_run
from torchlens.model.findings import FAILED
from torchlens.render.findings import COLORS

BOOM = "RuntimeError: boom on rank 1 at step 150"
VERDICT = f"rank 1 failed: {BOOM}; look at rank 1's log"
STOPPED = (f"ended with exit code 1: rank 1 failed ({BOOM}); rank 0 stopped when rank 1 went "
           "away (gloo: connection closed by peer)")


def _folder(tmp_path: Path, traces_dir: Path, **changes: object) -> Path:
    run = tmp_path / "run"
    ranks = []
    for r in (0, 1):
        (run / f"rank{r}").mkdir(parents=True)
        (run / f"rank{r}" / "step00004.pt.trace.json.gz").symlink_to(
            traces_dir / f"sampled_rank-{r}.json.gz")
        ranks.append(RankEntry(rank=r, traces=[f"rank{r}/step00004.pt.trace.json.gz"],
                               state="failed", error=BOOM if r else "RuntimeError: gloo",
                               stopped_at_step=150))
    # the shared traces are two ranks of a 128-rank job
    fields = {"source": SOURCE_RUN, "world_size": 128, "ranks": ranks, "exit_code": 1,
              "stopped": STOPPED, "verdict": VERDICT, **changes}
    write_manifest(str(run), Manifest(**fields))
    return run


def test_the_collectors_failure_verdict_is_a_failed_finding(tmp_path, traces_dir) -> None:
    from torchlens.formats.run_folder.manifest import read_manifest

    notes = collector_notes(read_manifest(str(_folder(tmp_path, traces_dir))))
    first = notes[0]
    assert first.severity == FAILED and first.code == "failed_rank", notes
    assert first.sentence == f"rank 1 failed: {BOOM}"
    assert first.advice == "look at rank 1's log" and first.title


def test_a_crashed_runs_report_leads_with_the_failure(tmp_path, traces_dir) -> None:
    run = load_run(str(_folder(tmp_path, traces_dir)), workers=1)
    text = kinds.text(run.profile)
    headline = text.splitlines()[0]
    assert f"rank 1 failed: {BOOM}" in headline, headline
    assert "2 ranks of 128 analysed" in headline
    first = run.analysis().findings[0]
    assert first.severity == FAILED and first.sentence == f"rank 1 failed: {BOOM}"
    assert text.splitlines()[1].startswith("- [failed] ")
    # in the page: the headline, and the failure first of the findings in red with its tag
    out = tmp_path / "run.html"
    assert main(["report", str(run.sources.root), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    findings = page.split(">Findings<", 1)[1]
    lead = findings.split('class="tl-finding', 2)[1]
    assert lead.startswith(f' {FAILED}"') and "[failed]" in lead and COLORS[FAILED] in lead
    assert f"rank 1 failed: {BOOM}" in page.split(">Findings<", 1)[0]


def test_a_lost_node_is_failed_too(tmp_path, traces_dir) -> None:
    from torchlens.formats.run_folder.manifest import read_manifest

    lost = ("node 1 (host gpu8) was lost: rank 1 stopped sending at step 7 (no heartbeat, no "
            "goodbye); the other ranks' data is kept; look at that node's torchrun log and "
            "network")
    m = read_manifest(str(_folder(tmp_path, traces_dir, verdict=lost, lost_nodes=[
        {"node": 1, "host": "gpu8", "words": "node 1 (host gpu8): rank 1 stopped sending"}])))
    first = collector_notes(m)[0]
    assert first.severity == FAILED and first.code == "lost_node"
    assert first.sentence == ("node 1 (host gpu8) was lost: rank 1 stopped sending at step 7 "
                              "(no heartbeat, no goodbye)")
    assert first.advice == ("the other ranks' data is kept; look at that node's torchrun "
                            "log and network")


def test_a_killed_rank_leads_as_a_lost_rank(tmp_path, traces_dir) -> None:
    """One rank killed while its node's other rank went on: the report's first
    finding is the lost rank, titled so, not a lost node."""
    from torchlens.formats.run_folder.manifest import read_manifest

    lost = ("rank 1 was lost: it stopped sending at step 7 (no goodbye, and node 0 (host vm)'s "
            "other ranks went on: killed (kill -9, the OOM killer) or hung); the other ranks' "
            "data is kept; look at torchrun's exit codes (-9: killed) and the kernel log "
            "(dmesg) for the OOM killer")
    m = read_manifest(str(_folder(tmp_path, traces_dir, verdict=lost, lost_nodes=[
        {"node": 0, "host": "vm", "ranks": [1], "words": "rank 1: it stopped sending",
         "whole_node": False}])))
    first = collector_notes(m)[0]
    assert first.severity == FAILED and first.title == "lost rank" and first.code == "lost_node"
    assert first.sentence.startswith("rank 1 was lost: it stopped sending at step 7")
    assert first.advice.startswith("the other ranks' data is kept; look at torchrun's exit")


@pytest.mark.parametrize("state", ["finished", "ended by its agent"])
def test_a_run_that_did_not_fail_keeps_its_verdict_as_a_sentence(tmp_path, traces_dir,
                                                                  state) -> None:
    from torchlens.formats.run_folder.manifest import read_manifest

    run = _folder(tmp_path, traces_dir, verdict="rank 1 is the slow rank: x; look at y",
                  ranks=[RankEntry(rank=r, state=state) for r in (0, 1)])
    notes = collector_notes(read_manifest(str(run)))
    assert str(notes[0]) == "torchlens run (every step of every rank): rank 1 is the slow rank: "\
        "x; look at y"


@pytest.mark.parametrize("code, failed", [("failed_rank", True), ("slow_rank", False)])
def test_the_manifests_verdict_code_says_what_stopped_the_run(tmp_path, traces_dir, code,
                                                              failed) -> None:
    """The collector saves its verdict's code: that, not the words, says
    whether the verdict is a failure the report leads with."""
    from torchlens.formats.run_folder.manifest import read_manifest

    said = "rank 1 could not go on: RuntimeError: boom; look at rank 1's log"
    first = collector_notes(read_manifest(str(_folder(tmp_path, traces_dir, verdict=said,
                                                      verdict_code=code))))[0]
    assert (first.severity == FAILED) is failed
    assert first.code == (code if failed else "collector_note")
    assert first.details.get("verdict_code", code) == code


def test_the_page_tags_each_finding_with_its_code_and_ranks(tmp_path, traces_dir) -> None:
    """A script picks the page's findings by ``data-code`` and ``data-ranks``,
    never by their words: the failure names rank 1 from the manifest's
    ``verdict_ranks``."""
    import re

    run = _folder(tmp_path, traces_dir, verdict_code="failed_rank", verdict_ranks=[1])
    out = tmp_path / "run.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    tags = re.findall(r'<div class="tl-finding [^"]*" data-code="([\w-]+)" '
                      r'data-severity="(\w+)"(?: data-ranks="([\d,]+)")?', page)
    assert tags[0] == ("failed_rank", FAILED, "1"), tags
    assert all(code for code, _, _ in tags) and len(tags) > 1
