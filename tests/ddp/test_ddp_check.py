"""%ddp_check end to end: real spawned ranks, gloo on CPU, 2 ranks (3 in two tests).

Each buggy function asserts what the user is told (rank, collective index,
op) and, via ``no_leftovers`` and ``assert_clean``, that no worker process or
process group survives and the store port is free again.
"""

from __future__ import annotations

import inspect
import time

import pytest

from torchlens import load
from torchlens.frontends.ddp.api import ddp_check

from . import buggy
from .conftest import assert_clean

pytestmark = pytest.mark.usefixtures("no_leftovers")


def run(fn, world_size=2, **kw):
    kw.setdefault("steps", 1)
    kw.setdefault("timeout", 20)
    result = ddp_check(fn, world_size=world_size, live=False, **kw)
    if kw.get("strict"):  # so that assert_clean's "board file removed" means something
        assert result.records.board, "--strict ran without a shared-memory board"
    assert_clean(result)
    return result


def line_of(fn, text: str) -> str:
    """``buggy.py:N`` of the line in ``fn`` that contains ``text``."""
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, hits
    return f"{inspect.getsourcefile(fn)}:{hits[0]}"


def test_correct_ddp_step_passes_every_check(tmp_path):
    result = run(buggy.correct_step, steps=2, strict=True, export=str(tmp_path / "r.html"))
    status = {i.name: i.status for i in result.checklist}
    assert status == {name: "passed" for name in status}, result.checklist
    assert result.ok
    seq = result.item("collective sequence")
    assert "every rank issued the same collectives" in seq.evidence
    coll = result.collectives()
    assert {"all_reduce", "broadcast"} <= set(coll["op"])  # DDP's own bucket all_reduce too
    assert (coll["line"].str.contains("buggy.py")).all()
    for r in (0, 1):  # every comparison stayed in shared memory: no digest differed
        stats = result.records.ranks[r].strict
        assert stats["compared"] == len(result.records.fingerprints[r]) > 0
        assert stats["via_store"] == 0, stats
    html = (tmp_path / "r.html").read_text()
    assert "Checklist" in html and "bokeh" in html.lower()
    from torchlens.frontends.ddp.api import DdpResult

    again = load(result.save(str(tmp_path / "r.tlprof")))
    assert isinstance(again, DdpResult)
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
        err = result.records.ranks[r].error
        assert err.type == "CollectiveMismatch"
        assert "collective #0" in err.message and f"rank {1 - r}:" in err.message
    for r in (0, 1):  # each rank names both ranks' lines, its own and its peer's
        err = result.records.ranks[r].error
        assert err.diagnosis["index"] == 0 and err.diagnosis["missing"] == []
        assert result.records.ranks[r].strict["via_store"] == 1
        if what == "op":
            assert (f"rank 0: #0 all_reduce float32[4] at "
                    f"{line_of(fn, 'dist.all_reduce(t)')}") in err.message
            assert (f"rank 1: #0 broadcast float32[4] at "
                    f"{line_of(fn, 'dist.broadcast(t')}") in err.message
        else:
            assert f"at {line_of(fn, 'dist.all_reduce(')}" in err.message
    if what == "op":
        assert item.details["ops"] == {0: "all_reduce", 1: "broadcast"}
        assert "rank 0: #0 all_reduce float32[4]" in item.evidence
        assert "rank 1: #0 broadcast float32[4]" in item.evidence
        # a plain op mismatch: the ops differ, nobody is said to have skipped one
        assert "the ranks issued different ops" in item.evidence
        assert "skipped" not in item.evidence and item.details["skipped"] == []
    assert result.records.outcome == "mismatch"
    assert result.item("crashed worker").status == "not applicable"
    assert time.monotonic() - start < 120


def test_shape_mismatch_without_strict_is_still_named():
    """gloo may abort a rank with SIGABRT; the fingerprints were published first."""
    result = run(buggy.shape_mismatch, timeout=5)
    item = result.item("collective sequence")
    assert item.status == "failed" and item.details["what"] == "shapes"
    assert "float32[4]" in item.evidence and "float32[5]" in item.evidence


def test_rank_skipping_a_collective():
    """The skip shows in the next collectives: rank 1's #0 is rank 0's #1."""
    result = run(buggy.skips_lookalike, strict=True)
    item = result.item("collective sequence")
    assert item.status == "failed"
    assert item.details["index"] == 1 and item.details["skipped"] == [1]
    assert item.details["skips"][1]["index"] == 0
    fn = buggy.skips_lookalike
    assert (f"rank 1 skipped a collective: it never issued rank 0's #0 all_reduce float32[4] "
            f"at {line_of(fn, 'rank 1 skips this')}; its own #0 is rank 0's #1") in item.evidence


def test_a_skip_that_only_looks_like_an_op_mismatch_is_not_called_one():
    """--strict stops skips_collective at #0: all the evidence says is that the
    ops differ (as for op_mismatch), not which rank skipped what."""
    result = run(buggy.skips_collective, strict=True)
    item = result.item("collective sequence")
    assert item.status == "failed"
    assert item.details["index"] == 0 and item.details["skipped"] == []
    assert "the ranks issued different ops" in item.evidence
    assert "skipped" not in item.evidence


def test_strict_peer_that_finished_without_a_collective():
    """Rank 1 never writes #1 on the board: rank 0 asks the store why, and says so."""
    result = run(buggy.stops_early, strict=True, timeout=60)
    err = result.records.ranks[0].error
    assert err.type == "CollectiveMismatch"
    assert "collective #1" in err.message
    assert "rank 1: never issued collective #1 (finished without it)" in err.message
    line = line_of(buggy.stops_early, "rank 1 returns without")
    assert f"rank 0: #1 all_reduce float32[4] at {line}" in err.message
    assert result.records.ranks[0].strict["late"] >= 1
    assert result.records.ranks[1].error is None
    # named as soon as rank 1's result appeared, not when --timeout (60 s) ran out
    issued = result.records.fingerprints[0][1].t
    assert err.t - issued < 20
    item = result.item("collective sequence")
    assert item.status == "failed" and item.details["index"] == 1
    assert item.details["missing"] == [1]
    assert "rank 1: never issued collective #1 (it finished without it)" in item.evidence
    assert result.records.outcome == "mismatch"


@pytest.mark.slow
def test_strict_hang_removes_the_board():
    """A peer that never arrives: the run ends at --timeout and leaves no file."""
    result = run(buggy.hangs, strict=True, timeout=3)
    assert result.records.outcome in ("hang", "mismatch", "crashed")
    err = result.records.ranks[0].error if result.records.ranks[0] else None
    if err is not None:  # --strict's own deadline fired before the hang detector
        assert "rank 1: never issued collective #0 (did not reach it)" in err.message
    else:
        assert "rank 0 is stuck at or after #0 all_reduce" in result.item("hang").evidence


@pytest.mark.slow
def test_hang_names_the_waiting_rank_and_stacks():
    start = time.monotonic()
    result = run(buggy.hangs, timeout=3)
    hang = result.item("hang")
    assert hang.status == "failed"
    assert "rank 0 is stuck at or after #0 all_reduce" in hang.evidence
    assert "rank 1 has issued no collective" in hang.evidence
    assert result.records.outcome == "hang"
    stacks = hang.details["stacks"]
    assert "hangs" in stacks[1] and "buggy.py" in stacks[1]  # rank 1 sits in time.sleep
    # the hang points at the rank holding the others up, and where it is
    assert hang.details["behind"] == [1] and hang.details["waiting"] == [0]
    assert f"now at {line_of(buggy.hangs, 'time.sleep(600)')} in hangs" in hang.evidence
    assert hang.advice.startswith("rank 1 never reached the collective that rank 0 wait")
    for name in ("environment", "communication"):  # stopped, not crashed: see the hang
        item = result.item(name)
        assert item.status == "not applicable" and item.advice == "see the hang line"
        assert "stopped by the hang detector" in item.evidence
    assert "before the hang detector stopped them" in result.item("crashed worker").evidence
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_op_mismatch_without_strict_hangs_and_is_named():
    result = run(buggy.op_mismatch, timeout=3)
    assert result.item("hang").status == "failed"
    item = result.item("collective sequence")
    assert item.status == "failed" and item.details["ops"] == {0: "all_reduce", 1: "broadcast"}


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


@pytest.mark.slow
def test_three_ranks_correct_step_passes_every_check():
    result = run(buggy.correct_step, world_size=3, steps=2, strict=True, timeout=60)
    status = {i.name: i.status for i in result.checklist}
    assert status == {name: "passed" for name in status}, result.checklist
    assert len(result.records.ranks) == 3 and all(result.records.ranks)
    for r in (0, 1, 2):
        assert result.records.ranks[r].strict["via_store"] == 0


@pytest.mark.slow
def test_three_ranks_only_the_last_diverges_and_is_named_on_every_rank():
    result = run(buggy.last_rank_diverges, world_size=3, strict=True, timeout=60)
    item = result.item("collective sequence")
    assert item.status == "failed" and item.details["index"] == 1
    assert item.details["ops"] == {0: "all_reduce", 1: "all_reduce", 2: "broadcast"}
    line = line_of(buggy.last_rank_diverges, "the last rank alone broadcasts")
    for r in (0, 1, 2):
        err = result.records.ranks[r].error
        assert err.type == "CollectiveMismatch" and "collective #1" in err.message
        assert f"rank 2: #1 broadcast float32[4] at {line}" in err.message


def test_lazy_torch_dynamo_import_is_not_a_hang():
    """DDP.__init__ imports torch._dynamo (2-3 s on this machine, no op runs):
    with --timeout 1.5 that is still progress, because modules keep loading."""
    result = run(buggy.correct_step, timeout=1.5)
    assert result.item("hang").status == "passed", result.item("hang").evidence
    assert result.ok, result.checklist


@pytest.mark.slow
def test_four_ranks_one_skipping_a_collective_is_named():
    result = run(buggy.one_rank_skips, world_size=4, strict=True, timeout=90)
    item = result.item("collective sequence")
    assert item.status == "failed"
    assert item.details["index"] == 1 and item.details["skipped"] == [1]
    assert item.details["skips"][1]["index"] == 0
    assert "rank 1 skipped a collective: it never issued rank 0's #0 all_reduce" in item.evidence
    assert len(result.records.ranks) == 4


def test_the_live_view_is_built_once_the_ranks_are_spawned():
    """A sink's ``start()`` runs after the workers exist, so a cold kernel's
    live-plot set-up (bokeh imports) overlaps their torch import."""
    import psutil

    from torchlens.capture.ddp import DdpOptions, run_check
    from torchlens.capture.ddp.options import DdpJob
    from torchlens.frontends.shared.live_publish import RankSink

    seen: list[int] = []

    class Inner:  # a RankFeed with nothing to draw
        def start(self):
            pass

        def push(self, hb):
            pass

        def push_steps(self, rank, records):
            pass

        def push_summary(self, rank, summary):
            pass

        def rank_ended(self, rank, reason, t):
            pass

        def flush(self, force=False):
            pass

        def close(self):
            pass

    def make_inner():
        seen.append(sum("torchlens.capture.ddp.worker" in " ".join(p.cmdline())
                        for p in psutil.Process().children()))
        return Inner()

    sink = RankSink("t", make_inner=make_inner)
    job = DdpJob(kind="function", fn=buggy.all_reduce_once, backend="gloo", strict=False,
                 timeout_s=20.0, steps=1, seed=0)
    rec = run_check(job, DdpOptions(world_size=2, backend="gloo", timeout_s=20.0, steps=1),
                    sink)
    assert rec.run.outcome == "finished"
    assert seen == [2] and isinstance(sink.inner, Inner)
    assert_clean(rec)


def test_tensor_gather_and_scatter_read_as_the_user_wrote_them():
    """torch 2.13 routes them through c10d::_allgather_base_ / _reduce_scatter_base_
    and typing_extensions' deprecation wrapper: the user sees neither."""
    result = run(buggy.gathers_and_scatters, strict=True)
    assert result.ok, result.checklist
    coll = result.collectives()
    for r in (0, 1):
        mine = coll[coll["rank"] == r]
        user = mine[mine["line"].str.contains("buggy.py")]
        assert list(user["op"]) == ["all_gather_into_tensor", "reduce_scatter_tensor"]
        assert list(user["line"]) == [line_of(buggy.gathers_and_scatters, "# gathered here"),
                                      line_of(buggy.gathers_and_scatters, "# scattered here")]
    assert not coll["line"].str.contains("typing_extensions|site-packages").any()
    assert not coll["op"].str.startswith("_").any()


def test_gather_against_scatter_names_both_public_calls_and_lines():
    result = run(buggy.gather_or_scatter, strict=True)
    item = result.item("collective sequence")
    assert item.details["ops"] == {0: "all_gather_into_tensor", 1: "reduce_scatter_tensor"}
    fn = buggy.gather_or_scatter
    assert (f"rank 0: #0 all_gather_into_tensor float32[8], float32[4] at "
            f"{line_of(fn, '# rank 0')}") in item.evidence
    assert (f"rank 1: #0 reduce_scatter_tensor float32[4], float32[8] at "
            f"{line_of(fn, '# rank 1')}") in item.evidence
    for r in (0, 1):
        assert "_base" not in result.records.ranks[r].error.message
        assert "typing_extensions" not in result.records.ranks[r].error.message


def test_every_c10d_collective_has_its_public_name():
    import torch

    from torchlens.capture.ddp.recorder import public_name

    assert public_name("c10d::_allgather_base_") == "all_gather_into_tensor"
    assert public_name("c10d::_reduce_scatter_base_") == "reduce_scatter_tensor"
    assert public_name("c10d::allreduce_") == "all_reduce"
    assert public_name("c10d::alltoall_base_") == "all_to_all_single"
    assert public_name("_c10d_functional::all_gather_into_tensor") == "all_gather_into_tensor"
    import torch.distributed as dist

    ops = sorted({s.name for s in torch._C._jit_get_all_schemas() if s.name.startswith("c10d::")})
    assert "c10d::_allgather_base_" in ops
    for op in ops:  # each c10d collective a user can call is named after its dist function
        if "coalesced" in op or op == "c10d::check_for_nan":
            continue  # issued by _coalescing_manager / NCCL's NaN check, no dist function
        assert hasattr(dist, public_name(op)), op
