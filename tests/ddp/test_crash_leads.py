"""A run where one rank raises: the crash leads the
checklist, and no other line claims what the crash left unmeasured.

Real gloo ranks, with and without --profile.
"""

from __future__ import annotations

import html
import re

import pytest

from torchlens.frontends.ddp.api import ddp_check
from torchlens.render.ddp.report import sections

from . import buggy, profiled
from .conftest import assert_clean

pytestmark = pytest.mark.usefixtures("no_leftovers")


def _checklist_text(res) -> str:
    body = str(sections(res.profile, res.analysis(), [])[0][1])
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def test_without_profile_the_exception_not_a_branch_explains_the_sequence():
    res = ddp_check(buggy.raises, world_size=2, backend="gloo", live=False, timeout=20)
    assert res.records.outcome == "crashed"
    assert res.checklist[0].name == "crashed worker" and res.checklist[0].status == "failed"
    seq = res.item("collective sequence")
    assert seq.status == "not applicable"
    assert "rank 1 stopped before collective #0 (it raised ValueError first)" in seq.evidence
    assert "rank-dependent" not in seq.advice and "crashed-worker" in seq.advice
    sync = res.item("parameter sync")
    assert "no DistributedDataParallel module was created" not in sync.evidence
    assert "rank 1" in sync.evidence
    assert_clean(res)


def test_with_profile_the_crash_leads_and_the_slow_rank_says_its_steps(tmp_path):
    res = ddp_check(profiled.crashing, world_size=2, backend="gloo", live=False, timeout=20,
                    profile=True, run_dir=str(tmp_path / "run"), steps=12, profile_every=4)
    assert res.records.outcome == "crashed"
    assert [i.name for i in res.checklist][0] == "crashed worker"
    # the report's checklist reads in that order too: the crash first
    text = _checklist_text(res)
    assert text.index("crashed worker") < min(text.index(t) for t in ("environment", "slow rank"))
    # the loop built a DDP module; the raise kept it from being checksummed
    sync = res.item("parameter sync")
    assert "no DistributedDataParallel module was created" not in sync.evidence
    assert sync.status == "not applicable" and "raised" in sync.evidence
    slow = res.item("slow rank")
    if slow.evidence.startswith("rank "):
        assert "before rank 1 raised" in slow.evidence
    assert_clean(res)
