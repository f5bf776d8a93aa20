"""Set-up is not a step: a rank whose set-up ran past the first
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


def test_set_up_window_and_first_steps_in_two_batches_before_a_flush() -> None:
    """A watch that applied two feed frames before drawing (rank 1's set-up
    window in one, its first steps in the next) drew step 0 twice: the window
    waiting to be drawn was drawn too."""
    steps, _ = make_run(world=2, steps=6, straggler=1)
    view = RankProfileView(2, every=5, modelled=False)
    view.push_steps(0, [setup_window(0), *steps[0]])
    view.push_steps(1, [setup_window(1)])
    view.push_steps(1, steps[1])  # the next frame, before any flush
    view.flush(force=True)
    assert [src.data["step"] for src in view.panels.steps] == [list(range(6))] * 2
    assert max(drawn_ms(view)) < 200


def test_a_function_without_steps_keeps_its_windows() -> None:
    view = RankProfileView(1, every=5, modelled=False, t0=T_START)
    view.push_steps(0, [StepRecord(step=i, t0=T_START + i, t1=T_START + i + 1, window=True)
                        for i in range(4)])
    view.flush(force=True)
    assert view.panels.step_fig.xaxis.axis_label == "window"
    assert view.panels.steps[0].data["step"] == [0, 1, 2, 3]


def test_one_rule_for_every_reader_of_a_torchlens_run(tmp_path) -> None:
    """``torchlens run`` keeps every record a rank sent, its set-up window too:
    the collector's verdict and rank table, and the run folder's readers, leave
    it out as the live view does (one rule, ``model.records.without_setup``)."""
    from statistics import median

    from torchlens.analysis.ranks.verdict import run_view
    from torchlens.formats.run_folder.records import read_steps, write_steps

    steps, _ = make_run(world=2, steps=12, straggler=1)
    sent = [[setup_window(r), *steps[r]] for r in range(2)]
    info = [{"rank": r, "node": 0, "host": "h0", "silent_s": 0.5, "bye": None,
             "heartbeat": {"steps_done": 12}, "steps_sent": 13, "shared_run_dir": True}
            for r in range(2)]
    view = run_view({"world_size": 2, "ranks": info, "steps": sent,
                     "summaries": [[], []], "dropped": 0, "restarts": [], "lost_after_s": 10.0})
    for r, row in enumerate(view.ranks):
        assert row.step_ms == median((s.t1 - s.t0) * 1e3 for s in steps[r])
    assert view.slow.steps == 12  # the window is not a step the verdict compares
    for r in range(2):
        write_steps(str(tmp_path), r, sent[r])
        assert [s.step for s in read_steps(str(tmp_path), r)] == list(range(12))


def test_a_restarted_ranks_set_up_goes_too_and_windows_alone_stay() -> None:
    from torchlens.model.records import without_setup

    steps, _ = make_run(world=1, steps=4, straggler=0)
    again = [StepRecord(step=s.step, t0=s.t0 + 100, t1=s.t1 + 100, restart=1) for s in steps[0]]
    setup2 = StepRecord(step=0, t0=90.0, t1=100.0, window=True, restart=1)
    kept = list(without_setup([setup_window(0), *steps[0], setup2, *again]))
    assert kept == [*steps[0], *again]
    alone = [StepRecord(step=i, t0=i, t1=i + 1, window=True) for i in range(3)]
    assert list(without_setup(alone)) == alone


def test_a_verdict_handed_in_shows_at_the_next_flush() -> None:
    """The watch's section lagged its header while the job ran: a
    verdict handed in (``take_verdict``) waits for no analysis interval."""
    import time

    from torchlens.model.findings import WARNING, Finding
    from torchlens.render.columns import FLUSH_S

    steps, _ = make_run(world=2, steps=6, straggler=1)
    view = RankProfileView(2, every=5, modelled=False)
    for r in range(2):
        view.push_steps(r, steps[r])
    view.flush(force=True)
    view._analysis_every = 3600.0  # as a long run's analysis makes it
    said = Finding(WARNING, "rank 1 is the slow rank: as the collector says, 42.2 ms")
    view.take_verdict(said, 1)
    time.sleep(FLUSH_S + 0.05)
    view.flush()
    assert "as the collector says, 42.2 ms" in view.panels.verdict.text


def test_a_ranks_first_steps_are_judged_at_the_next_flush() -> None:
    """A walk's live view said "no slow rank: only one rank has reported
    steps" while it drew three ranks' lines: the verdict waited for its
    analysis interval after the other ranks' first steps came."""
    import time

    from torchlens.render.columns import FLUSH_S

    steps, _ = make_run(world=2, steps=6, straggler=1)
    view = RankProfileView(2, every=5, modelled=False)
    view.push_steps(0, steps[0])
    view.flush(force=True)
    assert "only one rank has reported" in view.panels.verdict.text
    view._analysis_every = 3600.0  # as a long run's or a loaded machine's analysis makes it
    view.push_steps(1, steps[1])
    time.sleep(FLUSH_S + 0.05)
    view.flush()
    assert "only one rank has reported" not in view.panels.verdict.text


def test_the_live_step_chart_starts_at_zero_also_with_a_spike_above_its_axis() -> None:
    # the live chart's axis began near the lowest step time, so
    # ranks a few ms apart looked far apart; the run report's chart starts at 0
    steps, sums = make_run(world=2, steps=40, straggler=1)
    view = RankProfileView(2, every=5, modelled=True)
    spike = steps[0][30]
    steps[0][30] = StepRecord(step=spike.step, t0=spike.t0, t1=spike.t0 + 5.0,
                              phases=spike.phases)
    for r in range(2):
        view.push_steps(r, steps[r])
    view.flush(force=True)
    p = view.panels
    assert min(drawn_ms(view)) > 50  # every line is far above 0 ...
    assert p.step_fig.y_range.start == 0  # ... and the axis starts at 0 all the same
    assert p.step_cap.top is not None and p.step_cap.top < 1000  # the spike is off the axis
