"""%ddp_check --nnodes --profile: two torch elastic agents on this machine as two nodes.

World size 4 (2 nodes x 2 ranks), gloo on CPU. The live view is the real
one of the notebook (``ProfiledLiveView``: rank profile panels and heartbeat
lanes), built without a kernel: ``RankSink`` is swapped for one that feeds
it, so the test reads what the view would draw.
"""

from __future__ import annotations

import json

import pytest

from torchlens.frontends.ddp.api import ddp_check

from . import profiled
from .conftest import assert_clean
from .test_ddp_nnodes import OtherNode, free_port

pytestmark = pytest.mark.usefixtures("no_leftovers")

STEPS, EVERY = 6, 3


@pytest.fixture
def live_view(monkeypatch):
    """The live view a notebook shows, fed by the launcher as in a kernel."""
    import torchlens.frontends.shared.live_publish as lp
    from torchlens.frontends.shared.live_view import ProfiledLiveView

    view = ProfiledLiveView(4, EVERY, modelled=True)

    class Sink(lp.RankSink):
        def __init__(self, run, make_inner=None, **kw):
            super().__init__(run, inner=view, interval=0.0, **kw)

    monkeypatch.setattr(lp, "RankSink", Sink)
    return view


def _profiled(fn, tmp_path, steps=STEPS):
    """``ddp_check --nnodes 2 --profile``, node 1 started with the printed command."""
    node1 = OtherNode()
    try:
        result = ddp_check(fn, nnodes=2, nproc_per_node=2,
                           rdzv_endpoint=f"127.0.0.1:{free_port()}", backend="gloo",
                           profile=True, profile_every=EVERY, steps=steps,
                           run_dir=str(tmp_path / "run"), timeout=30, live=False,
                           on_other_nodes=node1)
    finally:
        node1.end()
    assert_clean(result)
    return result, node1


def test_profiled_run_on_two_nodes_keeps_every_ranks_steps_traces_and_ends(tmp_path, live_view):
    result, node1 = _profiled(profiled.balanced, tmp_path)
    assert result.records.outcome == "finished", result.checklist
    assert node1.proc.returncode == 0
    # the run folder: both nodes' ranks, each with its profiled steps' traces and every step
    run = tmp_path / "run"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["world_size"] == 4
    profiled_steps = [EVERY - 1, 2 * EVERY - 1]
    for rank in range(4):
        traces = manifest["ranks"][rank]["traces"]
        assert traces == [f"rank{rank}/step{i:05d}.pt.trace.json" for i in profiled_steps]
        assert all(json.loads((run / t).read_text())["traceEvents"] for t in traces)
        lines = (run / f"rank{rank}" / "steps.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in lines] == list(range(STEPS))
    prof = result.records.profiling
    assert [len(s) for s in prof.summaries] == [len(profiled_steps)] * 4
    assert [w.node for w in result.records.nodes.ranks] == [0, 0, 1, 1]
    # the checklist's per-rank lines cover all four, named by node
    memory = result.item("rank memory")
    assert all(f"rank {r} (node {r // 2}" in memory.evidence for r in range(4)), memory.evidence
    assert result.item("slow rank").details["steps"] == STEPS
    # the live view: every rank's steps drawn, every rank's end known; the red
    # mark is for a rank that stopped early, so a finished run has none
    view = live_view.profile
    assert [len(src.data["step"]) for src in view.panels.steps] == [STEPS] * 4
    assert view.ended == {r: "finished" for r in range(4)}
    assert view.panels.ended.data["text"] == []
    lanes = live_view.beats.layout.children[2].yaxis.major_label_overrides
    assert lanes[3] == "rank 3 (node 1)"


def test_a_killed_rank_without_a_result_is_marked_ended(tmp_path, live_view):
    # SIGKILL at step 4 sends nothing: under the agent the kernel sees the
    # rank's process gone, and the agent's log gives its exit code
    result, _ = _profiled(profiled.killed, tmp_path, steps=12)
    assert result.records.outcome == "crashed"
    assert live_view.profile.ended[1] in ("killed by SIGKILL",
                                          "its process ended without a result (killed by a "
                                          "signal?)")
    assert set(live_view.profile.ended) == {0, 1, 2, 3}
    crash = result.item("crashed worker")
    assert crash.status == "failed"
    assert crash.evidence.startswith("rank 1 (node 0, host "), crash.evidence
    assert "died with SIGKILL" in crash.evidence
    assert result.records.exit_codes[1] == -9

