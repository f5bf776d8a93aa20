"""A run the user stopped (Ctrl-C to ``torchlens run``): torchrun's agent ends
each rank with SIGTERM, and every view says those ranks were interrupted, as
the run's last line does ("interrupted after N steps"), not "ended by its
agent" (which reads as torchrun ending a node's workers when one failed)."""

from __future__ import annotations

from torchlens.analysis.ranks.verdict import folder_status, run_view
from torchlens.formats.run_folder.manifest import Manifest, RankEntry
from torchlens.frontends.ranks.command import _where_stopped
from torchlens.render.ranks.terminal import lines

from .test_run_view import _info, _rec, _snap


def _stopped(interrupted: bool):  # noqa: ANN202
    steps = [[_rec(i, 0.001, 0.01) for i in range(12)] for _ in range(2)]
    ranks = [_info(r, 0, bye={"reason": "SIGTERM"}) for r in range(2)]
    return run_view(_snap(ranks, steps), ended=True, interrupted=interrupted)


def test_ranks_of_an_interrupted_run_read_interrupted_in_the_table() -> None:
    view = _stopped(True)
    assert [r.state for r in view.ranks] == ["interrupted", "interrupted"]
    table = [ln for ln in lines(view) if ln.lstrip()[:1].isdigit()]
    assert all(ln.split()[3] == "interrupted" for ln in table), table
    assert _where_stopped(view, True, 130).startswith("interrupted after")


def test_ranks_ended_by_their_agent_without_a_ctrl_c_say_so() -> None:
    assert [r.state for r in _stopped(False).ranks] == ["ended by its agent"] * 2


def test_an_older_interrupted_manifest_reads_the_same() -> None:
    m = Manifest(source="torchlens run", world_size=2, interrupted=True,
                 verdict="no slow rank: step times within 1%",
                 ranks=[RankEntry(rank=r, traces=[], state="ended by its agent")
                        for r in range(2)])
    status = folder_status(m, [[], []], [[], []])
    assert [r.state for r in status.ranks] == ["interrupted", "interrupted"]
    assert [r.ended for r in status.ranks] == ["interrupted", "interrupted"]
    assert status.verdict == "no slow rank: step times within 1%"  # the run's own verdict kept


def _late(reasons: list[str]):  # noqa: ANN202
    """A run stopped as it ended: some ranks (or all) said goodbye after their last step."""
    steps = [[_rec(i, 0.001, 0.01) for i in range(12)] for _ in reasons]
    ranks = [_info(r, 0, bye={"reason": why}) for r, why in enumerate(reasons)]
    return run_view(_snap(ranks, steps), ended=True, interrupted=True)


def test_a_late_ctrl_c_says_what_the_rank_table_says() -> None:
    """Ctrl-C as torchrun was ending: the table reads every rank finished, and the
    last line must not call the run interrupted."""
    view = _late(["exit", "exit"])
    table = [ln for ln in lines(view) if ln.lstrip()[:1].isdigit()]
    assert all(ln.split()[3] == "finished" for ln in table), table
    said = _where_stopped(view, True, 130)
    assert said == "every rank finished before the stop: each said goodbye after 12 steps"
    # one rank had finished, the other was stopped: the line names the one that finished
    view = _late(["exit", "SIGTERM"])
    assert [r.state for r in view.ranks] == ["finished", "interrupted"]
    assert _where_stopped(view, True, 130) == (
        "interrupted after 12 steps (rank 0 had finished before the stop)")
