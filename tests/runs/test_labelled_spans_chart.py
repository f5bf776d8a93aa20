"""Evaluation and checkpoint spans in the report's "Every step over time" chart.

The Hugging Face Trainer's callback records them in steps.jsonl with a
``label``; drawn as ordinary steps they were unexplained spikes and dips in
the training line. Now they are their own markers with a legend entry, left
out of the step lines, and the note under the chart says so.
"""

from __future__ import annotations

from pathlib import Path

from bokeh.models import GlyphRenderer, MultiLine

from torchlens.analysis.ranks.series import step_series
from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest, RankEntry
from torchlens.formats.run_folder.records import collected_steps, write_steps
from torchlens.model.payloads import StepSeries
from torchlens.render.runs.steps_chart import sections, steps_figure


def _records() -> list[dict]:
    out, t = [], 1000.0
    for i in range(30):
        out.append({"step": i, "t0": t, "t1": t + 0.030})
        t += 0.031
        if i in (9, 19):
            out.append({"step": i, "t0": t, "t1": t + 0.900, "label": "evaluation"})
            t += 0.901
    out.append({"step": 29, "t0": t, "t1": t + 0.400, "label": "checkpoint"})
    return out


def _series(tmp_path: Path) -> StepSeries:
    m = Manifest(world_size=2, source=SOURCE_RUN, started=999.0,
                 ranks=[RankEntry(rank=0), RankEntry(rank=1)])
    for r in range(2):
        write_steps(str(tmp_path), r, _records())
    return step_series(collected_steps(str(tmp_path), m))


def test_labelled_spans_are_their_own_markers_not_steps(tmp_path: Path) -> None:
    series = _series(tmp_path)
    fig = steps_figure(series)
    lines = [r for r in fig.renderers if isinstance(r, GlyphRenderer)
             and isinstance(r.glyph, MultiLine)]
    drawn = [y for r in lines for ys in r.data_source.data["ys"] for y in ys]
    assert len(drawn) == 2 * 30 and max(drawn) < 100  # the training steps alone
    legend = {getattr(item.label, "value", None) for item in fig.legend[0].items}
    assert {"evaluation (not a step)", "checkpoint (not a step)"} <= legend, legend
    marked = [r for r in fig.renderers if isinstance(r, GlyphRenderer)
              and "label" in r.data_source.data and r.data_source.data["label"]]
    labels = sorted(lab for r in marked for lab in r.data_source.data["label"])
    assert labels == ["checkpoint"] * 2 + ["evaluation"] * 4


def test_the_note_under_the_chart_says_what_the_markers_are(tmp_path: Path) -> None:
    figures: list = []
    text = str(sections(_series(tmp_path), figures)[0])
    assert "6 evaluation and checkpoint spans" in text, text
    assert "left out of the step lines" in text


def test_the_live_step_chart_marks_labelled_spans_apart_from_the_steps() -> None:
    """The same for the live view (``%ddp_check --profile``, ``torchlens.watch``)."""
    from ranks.rank_fixtures import T_START, make_run

    from torchlens.render.ranks.view import RankProfileView

    steps, _ = make_run(world=2, steps=30, straggler=1)
    for recs in steps:
        last = recs[19]
        recs.insert(20, last.replace(t0=last.t1, t1=last.t1 + 0.9, label="evaluation",
                                     profiled=False))
    view = RankProfileView(2, every=5, modelled=False, t0=T_START)
    p = view.panels
    legend = {getattr(i.label, "value", None): i for i in p.step_fig.legend[0].items}
    assert not legend["evaluation or checkpoint (not a step)"].visible  # none yet
    for r in range(2):
        view.push_steps(r, steps[r])
    view.flush(force=True)
    assert all(max(src.data["step_ms"]) < 300 for src in p.steps)  # not on the step line
    assert all(len(src.data["step"]) == 30 for src in p.steps)
    assert p.spans.data["label"] == ["evaluation", "evaluation"]
    assert legend["evaluation or checkpoint (not a step)"].visible
