"""``torchlens run --no-profile``: the step records and the verdict without
torch.profiler on any rank (for a job where the profiler itself is the risk)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.ranks.helpers import Collector, free_port, report, torchrun_args


def test_no_profile_keeps_the_steps_and_the_verdict_without_traces(tmp_path: Path) -> None:
    out = tmp_path / "run"
    c = Collector(out, torchrun_args(1, 2, free_port()), run_options=("--no-profile",),
                  TL_STEPS="40", TL_SLOW_S="0.06")
    try:
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    assert list(out.rglob("*.pt.trace.json*")) == []  # no rank ran the profiler
    for r in (0, 1):  # every step of both ranks
        steps = (out / f"rank{r}" / "steps.jsonl").read_text().splitlines()
        assert len(steps) >= 40, (r, len(steps))
    verdict = next(line for line in c.lines if line.startswith("verdict:"))
    assert "rank 1" in verdict and "slow" in verdict, c.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verdict_ranks"] == [1], manifest.get("verdict")
    printed, page = report(out, tmp_path)  # a folder without traces still reports
    assert "input problem" not in printed + page  # traces left out on purpose: a note
    assert "rank 1 is the slow rank" in page
    assert "--no-profile" in page  # what it lacks, said
    assert "the traces below" not in page
    assert "step records of 2 ranks, no traces" in page


def test_a_run_folders_manifest_named_alone_reads_the_run(tmp_path: Path) -> None:
    """``torchlens report RUN/manifest.json``: the user means the run, not a trace."""
    out = tmp_path / "run"
    c = Collector(out, torchrun_args(1, 2, free_port()), run_options=("--no-profile",),
                  TL_STEPS="25", TL_SLOW_S="0.06")
    try:
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    _, page = report(out / "manifest.json", tmp_path)
    assert "rank 1 is the slow rank" in page
