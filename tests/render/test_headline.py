"""The run report's bold first line holds a long verdict by its first clause
(who is slow and why), not cut in the middle of a word or figure."""

from __future__ import annotations

from torchlens.analysis.ranks.slow import PartTime, slow_rank_finding
from torchlens.render.runs.report import HEADLINE_CHARS, headline


def test_a_long_verdict_keeps_its_first_clause_whole() -> None:
    finding = slow_rank_finding(
        1, PartTime("data", 40.4, 10.1, 30.3),
        "the others waited 30.1 ms per step for it (last in 19 of the last 20 steps); "
        "phase times: host timers (with NCCL the wait shows in the phase that next "
        "blocks on the GPU)")
    assert len(finding.sentence) > HEADLINE_CHARS
    line = headline(finding.sentence)
    assert line == ("rank 1 is the slow rank: its data loading took 40.4 ms per step, 4.0x "
                    "the others' median (10.1 ms) …")


def test_a_long_first_clause_is_cut_at_a_word() -> None:
    said = "worker 1 raised RuntimeError: " + "expected tensor of size 4096 " * 10
    line = headline(said)
    assert len(line) <= HEADLINE_CHARS and line.endswith(" expected…"), line
    assert headline("rank 0 failed: boom") == "rank 0 failed: boom"
