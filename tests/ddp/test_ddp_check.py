"""%ddp_check end to end: real spawned ranks, gloo on CPU, 2 ranks.

Each buggy function asserts what the user is told (rank, collective index,
op) and, via ``no_leftovers`` and ``assert_clean``, that no worker process or
process group survives and the store port is free again.
"""

from __future__ import annotations

import time

import pytest

from torchlens import load
from torchlens.frontends.ddp_api import ddp_check

from . import buggy
from .conftest import assert_clean

pytestmark = pytest.mark.usefixtures("no_leftovers")


def run(fn, **kw):
    kw.setdefault("steps", 1)
    kw.setdefault("timeout", 20)
    result = ddp_check(fn, world_size=2, live=False, **kw)
    assert_clean(result)
    return result


def test_correct_ddp_step_passes_every_check(tmp_path):
    result = run(buggy.correct_step, steps=2, strict=True, export=str(tmp_path / "r.html"))
    status = {i.name: i.status for i in result.checklist}
    assert status == {name: "passed" for name in status}, result.checklist
    assert result.ok
    seq = result.item("collective sequence")
    assert "every rank issued the same collectives" in seq.evidence
    coll = result.collectives()
    assert {"allreduce", "broadcast"} <= set(coll["op"])  # DDP's own bucket all_reduce too
    assert (coll["line"].str.contains("buggy.py")).all()
    html = (tmp_path / "r.html").read_text()
    assert "Checklist" in html and "bokeh" in html.lower()
    saved = load(result.save(str(tmp_path / "r.tlprof")))
    from torchlens.frontends.ddp_api import DdpResult

    again = DdpResult(saved)
    assert [i.to_dict() for i in again.checklist] == [i.to_dict() for i in result.checklist]


@pytest.mark.parametrize("fn, what", [(buggy.op_mismatch, "op"),
                                      (buggy.shape_mismatch, "shapes"),
                                      (buggy.dtype_mismatch, "dtypes")])
def test_strict_names_the_mismatch_on_every_rank(fn, what):
    start = time.monotonic()
    result = run(fn, strict=True)
    item = result.item("collective sequence")
    assert item.status == "failed"
    assert item.details["index"] == 0 and item.details["what"] == what
    assert "collective #0" in item.evidence
    for r in (0, 1):
        err = result.records["ranks"][r]["error"]
        assert err["type"] == "CollectiveMismatch"
        assert "collective #0" in err["message"] and f"rank {1 - r}:" in err["message"]
    if what == "op":
        assert item.details["ops"] == {0: "allreduce", 1: "broadcast"}
        assert "rank 0: #0 allreduce float32[4]" in item.evidence
        assert "rank 1: #0 broadcast float32[4]" in item.evidence
    assert result.records["outcome"] == "mismatch"
    assert result.item("crashed worker").status == "not applicable"
    assert time.monotonic() - start < 120


def test_shape_mismatch_without_strict_is_still_named():
    """gloo may abort a rank with SIGABRT; the fingerprints were published first."""
    result = run(buggy.shape_mismatch, timeout=5)
    item = result.item("collective sequence")
    assert item.status == "failed" and item.details["what"] == "shapes"
    assert "float32[4]" in item.evidence and "float32[5]" in item.evidence


def test_rank_skipping_a_collective():
    result = run(buggy.skips_collective, strict=True)
    item = result.item("collective sequence")
    assert item.status == "failed"
    assert item.details["index"] == 0 and item.details["skipped"] == [1]
    assert "rank 1 skipped a collective" in item.evidence


@pytest.mark.slow
def test_hang_names_the_waiting_rank_and_stacks():
    start = time.monotonic()
    result = run(buggy.hangs, timeout=3)
    hang = result.item("hang")
    assert hang.status == "failed"
    assert "rank 0 is stuck at or after #0 allreduce" in hang.evidence
    assert "rank 1 has issued no collective" in hang.evidence
    assert result.records["outcome"] == "hang"
    stacks = hang.details["stacks"]
    assert "hangs" in stacks[1] and "buggy.py" in stacks[1]  # rank 1 sits in time.sleep
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_op_mismatch_without_strict_hangs_and_is_named():
    result = run(buggy.op_mismatch, timeout=3)
    assert result.item("hang").status == "failed"
    item = result.item("collective sequence")
    assert item.status == "failed" and item.details["ops"] == {0: "allreduce", 1: "broadcast"}


def test_drifting_parameters():
    result = run(buggy.drifts)
    item = result.item("parameter sync")
    assert item.status == "failed"
    assert item.details["parameter"] == "weight" and item.details["ranks"] == [0, 1]
    assert "'weight'" in item.evidence


def test_nondeterministic_step():
    result = run(buggy.nondeterministic, steps=2)
    item = result.item("determinism")
    assert item.status == "failed"
    assert item.details["op"] is not None and "buggy.py" in item.details["op"]["line"]
    assert result.item("parameter sync").status == "passed"  # DDP keeps ranks in sync


def test_worker_raising():
    result = run(buggy.raises)
    item = result.item("crashed worker")
    assert item.status == "failed"
    assert item.evidence.startswith("rank 1 raised ValueError: bad batch on rank 1")
    assert "raise ValueError" in item.details["traceback"]


def test_inconsistent_env():
    result = run(buggy.inconsistent_env)
    item = result.item("environment")
    assert item.status == "failed"
    assert "MASTER_PORT differs" in item.evidence and "rank 1=29501" in item.evidence
