"""An input-bound job: every rank spends most of its step waiting for its next
batch (``analysis.ranks.input_bound``); a job whose workers keep up, and a
single rank with slow data (the slow rank's case), are not input-bound."""

from __future__ import annotations

from torchlens.analysis.ranks.input_bound import INPUT_SHARE, input_bound
from torchlens.model.findings import INPUT_BOUND, WARNING
from torchlens.model.records import StepRecord

T0 = 1795804276.0


def _rank(data_ms: float, step_ms: float, steps: int = 40) -> list[StepRecord]:
    rest = (step_ms - data_ms) / 1e3
    out, t = [], T0
    for s in range(steps):
        phases = {"data": data_ms / 1e3, "forward": rest / 3, "backward": rest / 3,
                  "optimizer": rest / 6, "collective": 0.0}
        out.append(StepRecord(step=s, t0=t, t1=t + step_ms / 1e3, phases=phases))
        t += step_ms / 1e3
    return out


def test_every_rank_waiting_on_its_loader_is_input_bound():
    """The zoo's starved job: 29-36 ms of loading in a 52-57 ms step on both ranks."""
    f = input_bound([_rank(29.0, 57.0), _rank(35.8, 53.0)])
    assert f is not None and f.code == INPUT_BOUND and f.severity == WARNING
    assert f.ranks == (0, 1)
    assert f.sentence.startswith("the job is input-bound: every rank waits for its next "
                                 "batch 51%-68% of its step")
    assert "num_workers" in f.advice


def test_loaders_with_workers_that_keep_up_are_not():
    """Its twin with two workers: 1.5-3.9 ms of 5-9 ms, under half."""
    assert input_bound([_rank(3.9, 9.0), _rank(2.4, 9.0)]) is None
    assert input_bound([_rank(0.2, 12.0), _rank(0.1, 12.0)]) is None


def test_one_rank_with_slow_data_is_the_slow_ranks_case_not_this():
    assert input_bound([_rank(0.2, 45.0), _rank(30.9, 45.0)]) is None


def test_tiny_steps_one_rank_or_too_few_steps_are_not_judged():
    assert input_bound([_rank(0.6, 1.0), _rank(0.6, 1.0)]) is None  # under 1 ms of data
    assert input_bound([_rank(30.0, 50.0)]) is None
    assert input_bound([_rank(30.0, 50.0, steps=3), _rank(30.0, 50.0, steps=3)]) is None
    assert INPUT_SHARE == 0.5


def test_labelled_spans_are_no_steps():
    ranks = [_rank(30.0, 50.0), _rank(30.0, 50.0)]
    ranks = [[rec.replace(label="evaluation") for rec in recs] for recs in ranks]
    assert input_bound(ranks) is None
