"""Set-up is not a step (issue 21 #3): a rank whose set-up ran past the first
window sent a window record (8.5 s at step 0) before its first
``torchlens.step()``; the live view, its static copy and the watch must draw
only the real steps, on an axis named "step", as the run's steps.jsonl has them.
"""

from __future__ import annotations

from ranks.rank_fixtures import T_START, make_run
from torchlens.model.records import StepRecord
from torchlens.render.ranks.view import RankProfileView

SETUP_S = 8.5


def setup_window(rank: int) -> StepRecord:
    return StepRecord(step=0, t0=T_START - SETUP_S, t1=T_START, window=True,
                      phases={"data": None})


def drawn_ms(view: RankProfileView) -> list[float]:
    return [ms for src in view.panels.steps for ms in src.data["step_ms"]]


def test_set_up_window_is_taken_off_once_the_rank_steps() -> None:
    steps, sums = make_run(world=2, steps=12, straggler=1)
    view = RankProfileView(2, every=5, modelled=True, t0=T_START - SETUP_S)
    for r in range(2):
        view.push_steps(r, [setup_window(r)])
    view.flush(force=True)
    # while nothing else came, the windows are what there is, named so
    assert view.panels.step_fig.xaxis.axis_label == "window"
    assert max(drawn_ms(view)) == SETUP_S * 1e3
    for r in range(2):  # the first real steps: step 0 again
        view.push_steps(r, steps[r][:5])
    view.flush(force=True)
    for r in range(2):
        view.push_steps(r, steps[r][5:])
        for s in sums[r]:
            view.push_summary(r, s)
    view.flush(force=True)
    p = view.panels
    assert p.step_fig.xaxis.axis_label == "step"
    assert max(drawn_ms(view)) < 200  # the real steps, about 110 ms each
    for r in range(2):
        assert p.steps[r].data["step"] == list(range(12))
        assert p.mem[r].data["step"] == list(range(12))
        assert all(not rec.window for rec in view.records[r])
    assert len(p.profiled.data["step"]) == sum(rec.profiled for s in steps for rec in s)


def test_set_up_window_in_the_same_batch_as_the_first_steps() -> None:
    """A rank that sent its set-up window and its first steps together (one
    heartbeat) is drawn as the run's records have it."""
    steps, _ = make_run(world=2, steps=6, straggler=1)
    view = RankProfileView(2, every=5, modelled=False)
    for r in range(2):
        view.push_steps(r, [setup_window(r), *steps[r]])
    view.flush(force=True)
    assert view.panels.step_fig.xaxis.axis_label == "step"
    assert max(drawn_ms(view)) < 200
    assert [src.data["step"] for src in view.panels.steps] == [list(range(6))] * 2


def test_a_function_without_steps_keeps_its_windows() -> None:
    view = RankProfileView(1, every=5, modelled=False, t0=T_START)
    view.push_steps(0, [StepRecord(step=i, t0=T_START + i, t1=T_START + i + 1, window=True)
                        for i in range(4)])
    view.flush(force=True)
    assert view.panels.step_fig.xaxis.axis_label == "window"
    assert view.panels.steps[0].data["step"] == [0, 1, 2, 3]
