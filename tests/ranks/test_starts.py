"""Steps counted across an elastic job's starts (``analysis.ranks.starts``)."""

from __future__ import annotations

from torchlens.analysis.ranks.starts import StepStarts
from torchlens.model.records import StepRecord, StepSummary


def _recs(steps: range, start: int = 0, t0: float = 0.0) -> list[StepRecord]:
    out = []
    for i in steps:
        rec = StepRecord(step=i, t0=t0 + i, t1=t0 + i + 0.5, phases={"data": 0.001})
        out.append(rec.replace(restart=start) if start else rec)
    return out


def test_a_restart_is_drawn_after_every_step_of_the_start_before_it():
    s = StepStarts()
    # rank 1 did one step more before the restart; both arrive in one frame
    placed = s.place_steps({0: _recs(range(5)) + _recs(range(3), 1, 100.0),
                            1: _recs(range(6)) + _recs(range(3), 1, 100.0)})
    assert [r.step for r in placed[0]] == [0, 1, 2, 3, 4, 6, 7, 8]
    assert [r.step for r in placed[1]] == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert s.take_marks() == [(1, 6)] and s.take_marks() == []
    # the records keep everything else; the first start's are passed as they are
    assert placed[0][5].phases == {"data": 0.001} and placed[0][5].restart == 1
    # later frames of start 1 keep its offset; start 2 goes after it
    later = s.place_steps({0: _recs(range(3, 5), 1, 100.0) + _recs(range(2), 2, 200.0)})
    assert [r.step for r in later[0]] == [9, 10, 11, 12]
    assert s.take_marks() == [(2, 11)]
    assert s.marks() == [(1, 6), (2, 11)]  # every restart, for a view drawn anew


def test_a_job_that_never_restarted_is_left_as_it_is():
    s = StepStarts()
    recs = _recs(range(4))
    assert s.place_steps({0: recs})[0] == recs
    assert s.take_marks() == []
    summary = StepSummary(step=2, t0=2.0)
    assert s.place_summary(0, summary) is summary


def test_summaries_follow_their_start_by_its_tag_or_by_time():
    s = StepStarts()
    s.place_steps({0: _recs(range(5)) + _recs(range(5), 1, 100.0)})
    # the live feed tags a restarted start's summary
    assert s.place_summary(0, StepSummary.of({"step": 3, "t0": 103.0, "restart": 1})).step == 8
    # a finished folder's summaries.jsonl does not: its t0 says which start it is of
    assert s.place_summary(0, StepSummary.of({"step": 3, "t0": 103.0})).step == 8
    assert s.place_summary(0, StepSummary.of({"step": 3, "t0": 3.0})).step == 3
    # a tagged summary that comes before its start's first steps places the start
    fresh = StepStarts()
    fresh.place_steps({0: _recs(range(4))})
    assert fresh.place_summary(0, StepSummary.of({"step": 0, "t0": 50.0, "restart": 1})).step == 4
    assert fresh.take_marks() == [(1, 4)]
    assert [r.step for r in fresh.place_steps({0: _recs(range(2), 1, 50.0)})[0]] == [4, 5]
