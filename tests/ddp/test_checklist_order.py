"""Which checklist line a user reads first when a run has several warnings
(a leaking rank's creep sat below a slow-rank warning
that no measured part explained)."""

from __future__ import annotations

from types import SimpleNamespace

from torchlens.analysis.ddp import checks
from torchlens.model.findings import PASSED, WARNING, Figure, Finding


def _order(monkeypatch, slow: Finding, memory: Finding) -> list[str]:
    lines = [Finding(PASSED, "2 of 2 ranks reported", title="environment"), slow, memory]
    monkeypatch.setattr(checks, "CHECKS", tuple((lambda rec, f=f: f) for f in lines))
    return [i.title for i in checks.checklist(SimpleNamespace(nodes=None))]


CREEP = Finding(WARNING, "rank 1: memory creep, +1.3 MiB per step over 10 steps",
                title="rank memory")


def test_a_creep_leads_a_slow_rank_no_part_explains(monkeypatch) -> None:
    weak = Finding(WARNING, "rank 1 is the slow rank: no measured part explains it",
                   (Figure("rank", 1),), title="slow rank")
    assert _order(monkeypatch, weak, CREEP) == ["environment", "rank memory", "slow rank"]


def test_a_slow_rank_with_its_cause_keeps_its_place(monkeypatch) -> None:
    strong = Finding(WARNING, "rank 1 is the slow rank: its data loading took 40 ms per step",
                     (Figure("rank", 1), Figure("cause", "data")), title="slow rank")
    assert _order(monkeypatch, strong, CREEP) == ["environment", "slow rank", "rank memory"]
