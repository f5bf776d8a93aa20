"""A trace report's Bokeh document stays small.

Bokeh walks every model's properties to build and again to serialize it, and a
notebook pays that for every shown result: the warm ``%%torchprof`` cell's
report doubled when the step chart (a renderer, stack transforms and a hover
per role) and the timeline legend (a renderer per colour) came in, 107 models
where 8cc97e2's report had 35. The same figures, sections and legends now take
at most 70.
"""

from __future__ import annotations

from typing import Any

from render_fixtures import make_trace

from torchlens.analysis.trace.analyze import analyze
from torchlens.model import Profile
from torchlens.render.trace.report import trace_sections


def _steps_trace() -> Any:
    rows = []
    for i in range(10):  # ten steps of CPU ops and a dataloader fetch, as in a cell
        t = i * 1000
        rows += [
            {"name": f"ProfilerStep#{i}", "cat": "user_annotation", "ts": t, "dur": 900,
             "pid": 1, "tid": 1},
            {"name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
             "cat": "user_annotation", "ts": t + 10, "dur": 100, "pid": 1, "tid": 1},
            {"name": "aten::linear", "cat": "cpu_op", "ts": t + 200, "dur": 300,
             "pid": 1, "tid": 1},
            {"name": "aten::mm", "cat": "cpu_op", "ts": t + 210, "dur": 200, "pid": 1, "tid": 1},
            {"name": "train.py(12): step", "cat": "python_function", "ts": t + 600, "dur": 50,
             "pid": 1, "tid": 1},
        ]
    return make_trace(rows)


def test_trace_report_figures_stay_within_70_bokeh_models() -> None:
    analysis = analyze(Profile(kind="trace", title="t", created_at=0.0,
                               traces={"main": _steps_trace()}))
    figures: list[Any] = []
    sections = trace_sections(analysis.views[0], figures, "")
    titles = [f.title.text.split(":")[0] for f in figures]
    assert titles == ["Step breakdown", "Timeline"], titles
    assert any("Step breakdown" in str(s) for s in sections)
    models = set().union(*(f.references() for f in figures))
    assert len(models) <= 70, len(models)
    # what the user reads is all there: a legend entry per role and per colour drawn
    step_legend, timeline_legend = (list(f.legend)[0] for f in figures)
    assert len(step_legend.items) >= 2
    assert {item.label.value if hasattr(item.label, "value") else item.label
            for item in timeline_legend.items} >= {"cpu_op", "python_function"}
