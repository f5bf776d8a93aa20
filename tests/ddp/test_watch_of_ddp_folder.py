"""``torchlens.watch`` of a ``%ddp_check --profile`` run folder.

The folder keeps every rank's step records and its profiled steps' Kineto
traces, but no ``summaries.jsonl`` (``torchlens run`` writes that). A walk
saw the watch of such a folder say fragmentation and the largest free block
"not measured" and draw an empty profiled-step timeline while the
``%ddp_check`` view of the same run drew them; and its state lane started at
0 s where the ``%ddp_check`` view's started 7 s after launch.
"""

from __future__ import annotations

import math

import pytest

from torchlens.formats.run_folder.manifest import read_manifest
from torchlens.frontends.ddp.api import ddp_check
from torchlens.frontends.ranks.watch import Watch
from torchlens.frontends.ranks.watch_sources import _folder, folder_frame

from . import profiled
from .conftest import assert_clean


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("watchddp") / "run"
    res = ddp_check(profiled.balanced, world_size=2, backend="gloo", live=False, profile=True,
                    run_dir=str(run_dir), steps=12, profile_every=5)
    assert res.records.outcome == "finished"
    assert_clean(res)
    return res, str(run_dir)


def _watched(run_dir: str) -> Watch:
    source, label, note = _folder(run_dir)
    w = Watch(source, label, timeout=5.0, note=note)
    for frame in source.read():
        w._apply(frame)
    w.view.flush(force=True)
    return w


def test_the_watch_of_a_ddp_check_folder_draws_its_profiled_steps(run) -> None:
    res, run_dir = run
    frame = folder_frame(run_dir)
    for r in range(2):
        traces = read_manifest(run_dir).rank(r).traces
        assert traces, "the run kept no trace: the test proves nothing"
        summaries = frame.summaries[str(r)]
        assert [s["trace"] for s in summaries] == traces
        assert all(s["memory"]["source"] == "modelled" for s in summaries)
    p = _watched(run_dir).view.profile.panels
    # modelled at the profiled steps only: kept, said in one line, not drawn as a timeline
    assert not p.mem_fig.visible and "modelled at the profiled steps only" in p.mem_note.text
    frag = [v for src in p.mem_prof for v in src.data["frag"] if not math.isnan(v)]
    assert frag, "fragmentation not drawn"
    assert p.ops.data["left"], "the profiled-step timeline is empty"
    assert any(v > 0 for v in p.roles.data["kernel_ms"] + p.roles.data["cpu_exec_ms"])


def test_the_watch_of_a_ddp_check_folder_keeps_the_runs_time_origin(run) -> None:
    """One origin: seconds since launch, as the %ddp_check view draws them."""
    res, run_dir = run
    assert read_manifest(run_dir).started == pytest.approx(res.records.t0)
    assert folder_frame(run_dir).t0 == pytest.approx(res.records.t0)
    beats = _watched(run_dir).view.beats.quads.data["left"]
    first_step = min(rec.t0 for recs in res.records.profiling.steps for rec in recs)
    assert min(beats) >= first_step - res.records.t0 - 0.5
