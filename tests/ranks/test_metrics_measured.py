"""What ``torchlens run --metrics`` exports is what was measured: a CPU
run's modelled allocator figures are not exported as the CUDA allocator's, and each rank's
median step time is the terminal's own figure, not a bucket interpolation."""

from __future__ import annotations

import statistics

from prometheus_client.parser import text_string_to_metric_families

from torchlens.analysis.ranks.metrics import StepHistograms, metric_families
from torchlens.analysis.ranks.verdict import run_view
from torchlens.model.records import StepRecord
from torchlens.render.metrics_text import exposition

from .test_metrics_exposition import _info, _view

ALLOCATOR = ("torchlens_memory_allocated_bytes", "torchlens_memory_reserved_bytes",
             "torchlens_fragmentation_ratio", "torchlens_largest_free_block_bytes")


def _rec(step: int, step_s: float, mem: dict | None = None) -> StepRecord:
    t0 = step * 0.1
    return StepRecord.from_dict({"step": step, "t0": t0, "t1": t0 + step_s,
                                 "phases": {"data": 0.001, "forward": 0.002},
                                 "mem": {"rss": 100 << 20, **(mem or {})}})


def _series(view, steps) -> dict:
    hist = StepHistograms()
    for r, recs in enumerate(steps):
        hist.add(r, recs)
    text = exposition(metric_families(view, "exp1", hist.ranks, {}))
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)}


def _cpu_summary(step: int) -> dict:
    """A CPU rank's profiled-step summary: the allocator replayed (``modelled``)."""
    return {"step": step, "t0": step * 0.1, "t1": step * 0.1 + 0.03,
            "memory": {"allocated": 12800, "reserved": 2 << 20, "inactive_split": 2084352,
                       "largest_free": 2083840, "source": "modelled"}}


def test_a_cpu_run_exports_no_allocator_series_only_rss() -> None:
    steps = [[_rec(i, 0.03) for i in range(8)] for _ in range(2)]
    summaries = [[_cpu_summary(4)], [_cpu_summary(4)]]
    view = run_view({"world_size": 2, "ranks": [_info(0, 0), _info(1, 0)], "steps": steps,
         "summaries": summaries, "dropped": 0, "lost_after_s": 10.0})
    assert [row.source for row in view.ranks] == ["modelled", "modelled"]
    assert view.ranks[0].frag > 0.9  # the modelled figure the terminal marks with ~
    got = _series(view, steps)
    for name in ALLOCATOR:
        assert name not in got, name
    assert [v for _, v in got["torchlens_memory_rss_bytes"]] == [100 << 20] * 2


def test_a_cuda_run_exports_the_allocator_series() -> None:
    mem = {"allocated": 3 << 20, "reserved": 8 << 20, "inactive_split": 4 << 20,
           "source": "cuda"}
    steps = [[_rec(i, 0.03, mem) for i in range(8)] for _ in range(2)]
    got = _series(_view([_info(0, 0), _info(1, 0)], steps), steps)
    assert [v for _, v in got["torchlens_fragmentation_ratio"]] == [0.5, 0.5]
    assert [v for _, v in got["torchlens_memory_reserved_bytes"]] == [8 << 20] * 2


def test_each_rank_exports_the_terminals_median_step() -> None:
    # every step in the 25-50 ms bucket: a histogram_quantile reads ~37.5 ms for all
    times = [[0.0300, 0.0330, 0.0337, 0.0338, 0.0345, 0.0400, 0.0420],
             [0.0310, 0.0312, 0.0313, 0.0490, 0.0495, 0.0499, 0.0300]]
    steps = [[_rec(i, t) for i, t in enumerate(ts)] for ts in times]
    view = _view([_info(0, 0), _info(1, 0)], steps)
    got = _series(view, steps)
    medians = {labels["rank"]: v for labels, v in got["torchlens_step_median_seconds"]}
    assert medians == {str(r): view.ranks[r].step_ms / 1000 for r in range(2)}
    assert abs(medians["0"] - statistics.median(times[0])) < 1e-12
    assert abs(medians["1"] - statistics.median(times[1])) < 1e-12


def test_set_up_windows_and_labelled_spans_are_not_steps() -> None:
    """A start's set-up window and an evaluation or checkpoint span are not
    training steps: the histogram counts the steps only."""
    window = StepRecord.from_dict({"step": 0, "t0": 0.0, "t1": 5.0, "window": True})
    save = StepRecord.from_dict({"step": 2, "t0": 9.0, "t1": 12.0, "label": "checkpoint"})
    real = [_rec(i, 0.03 + i / 1000) for i in range(3)]
    hist = StepHistograms()
    hist.add(0, [window])
    hist.add(0, [*real[:2], save, real[2]])
    assert hist.ranks[0].count == 3
    assert abs(hist.ranks[0].total_s - sum(r.t1 - r.t0 for r in real)) < 1e-12
