"""The Prometheus series of ``torchlens run --metrics`` on hand-made collector snapshots,
read back with prometheus_client's own text parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from torchlens.analysis.ranks.metrics import BUCKETS, StepHistograms, metric_families
from torchlens.analysis.ranks.verdict import run_view
from torchlens.model.records import StepRecord
from torchlens.render.metrics_text import exposition


def _rec(step: int, data: float, backward: float, step_s: float = 0.045,
         window: bool = False) -> StepRecord:
    t0 = step * 0.1
    return StepRecord.from_dict({"step": step, "t0": t0, "t1": t0 + step_s, "window": window,
                                 "phases": {"data": data, "forward": 0.002, "backward": backward,
                                            "optimizer": 0.001, "collective": 0.0},
                                 "mem": {"rss": 100 << 20, "allocated": 3 << 20,
                                         "reserved": 8 << 20, "inactive_split": 2 << 20,
                                         "source": "cuda"}})


def _info(rank: int, node: int, **kw: object) -> dict:
    return {"rank": rank, "node": node, "host": f"h{node}", "silent_s": 0.5, "bye": None,
            "heartbeat": {"steps_done": 12}, "steps_sent": 12, "shared_run_dir": True,
            "incarnation": 0, **kw}


def _view(ranks: list, steps: list):
    return run_view({"world_size": len(ranks), "ranks": ranks, "steps": steps,
                     "summaries": [[] for _ in ranks], "dropped": 0, "lost_after_s": 10.0})


def _parse(text: str) -> dict:
    """name -> [(sample name, labels, value)], by prometheus_client's parser."""
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)}


def _straggler_steps() -> list:
    data = {0: 0.0002, 1: 0.040, 2: 0.0003}
    return [[_rec(i, data[r], 0.041 if r != 1 else 0.001) for i in range(12)] for r in range(3)]


def test_straggler_run_exports_slow_rank_cause_and_valid_text() -> None:
    steps = _straggler_steps()
    ranks = [_info(0, 0), _info(1, 0, incarnation=1), _info(2, 1, bye={"reason": "exception"})]
    view = _view(ranks, steps)
    hist = StepHistograms()
    for r in range(3):
        hist.add(r, steps[r])
    text = exposition(metric_families(view, "exp1", hist.ranks, {0: 0.5, 1: 2.0, 2: 30.0}))
    got = _parse(text)
    assert got["torchlens_slow_rank"] == [
        ("torchlens_slow_rank", {"run": "exp1", "rank": "1", "node": "0", "host": "h0",
                                 "cause": "data"}, 1.0)]
    # the others waited about 40 ms a step for rank 1
    (_, _, wait), = got["torchlens_slow_rank_wait_seconds"]
    assert 0.035 < wait < 0.045
    assert got["torchlens_world_size"][0][2] == 3
    # a histogram of every step, in seconds: all 12 steps of 45 ms under le=0.05
    buckets = {s[1]["le"]: s[2] for s in got["torchlens_step_seconds"]
               if s[0].endswith("_bucket") and s[1]["rank"] == "0"}
    assert buckets["0.025"] == 0 and buckets["0.05"] == 12 and buckets["+Inf"] == 12
    assert len(buckets) == len(BUCKETS) + 1
    # counters end in _total; states are one-hot
    assert got["torchlens_steps"][0][0] == "torchlens_steps_total"
    states = {(s[1]["rank"], s[1]["state"]): s[2] for s in got["torchlens_rank_state"]}
    assert states[("0", "up")] == 1 and states[("2", "failed")] == 1
    assert sum(v for (r, _), v in states.items() if r == "2") == 1
    restarts = {s[1]["rank"]: s[2] for s in got["torchlens_restarts"]}
    assert restarts == {"0": 0, "1": 1, "2": 0}
    phases = {s[1]["phase"] for s in got["torchlens_step_phase_seconds"]}
    assert phases == {"data", "forward", "backward", "optimizer", "collective", "other"}
    frag = {s[1]["rank"]: s[2] for s in got["torchlens_fragmentation_ratio"]}
    assert frag["0"] == 0.25
    assert {s[1]["rank"]: s[2] for s in got["torchlens_heartbeat_age_seconds"]}["2"] == 30.0
    # nothing but these labels
    keys = {k for samples in got.values() for _, labels, _ in samples for k in labels}
    assert keys <= {"run", "rank", "node", "host", "phase", "state", "cause", "le"}


def test_label_values_are_escaped() -> None:
    steps = _straggler_steps()[:2]
    evil = 'h"0\\\n} evil_metric 1'
    view = _view([_info(0, 0, host=evil), _info(1, 0, host=evil)], steps)
    text = exposition(metric_families(view, 'run"x', {}, {}))
    assert "\nevil_metric" not in text  # the line feed cannot start a forged sample
    got = _parse(text)
    assert "evil_metric" not in got
    hosts = {s[1]["host"] for s in got["torchlens_rank_state"]}
    assert hosts == {evil}
    assert {s[1]["run"] for s in got["torchlens_world_size"]} == {'run"x'}


def test_histogram_counts_every_step_across_batches_and_restarts() -> None:
    hist = StepHistograms()
    first = [_rec(i, 0.0, 0.0, step_s=0.2) for i in range(5)]
    setup = _rec(0, 0.0, 0.0, step_s=4.0, window=True)  # set-up: not a step
    hist.add(0, [setup, *first[:2]])
    hist.add(0, first[2:])
    # the rank's restart sends its own batches; its steps add to the same rank
    hist.add(0, [_rec(0, 0.0, 0.0, step_s=2.0), _rec(1, 0.0, 0.0, step_s=70.0)])
    h = hist.ranks[0]
    assert h.count == 7
    assert abs(h.total_s - (5 * 0.2 + 2.0 + 70.0)) < 1e-9
    assert h.buckets[BUCKETS.index(0.25)] == 5 and h.buckets[BUCKETS.index(2.5)] == 6
    assert h.buckets[BUCKETS.index(60.0)] == 6 and h.buckets[-1] == 7


def test_no_slow_rank_exports_no_slow_series_and_waiting_ranks() -> None:
    steps = [[_rec(i, 0.001, 0.01) for i in range(12)] for _ in range(2)] + [[]]
    view = _view([_info(0, 0), _info(1, 0), None], steps)
    got = _parse(exposition(metric_families(view, "exp1", {}, {})))
    assert "torchlens_slow_rank" not in got
    states = {(s[1]["rank"], s[1]["state"]): s[2] for s in got["torchlens_rank_state"]}
    assert states[("2", "waiting")] == 1
    waiting = next(s[1] for s in got["torchlens_rank_state"] if s[1]["rank"] == "2")
    assert waiting["host"] == "" and waiting["node"] == ""
    assert got["torchlens_ranks_attached"][0][2] == 2
