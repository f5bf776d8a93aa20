"""Skipped optimizer steps and recompiles marked in the report's "Every step
over time" chart: the step stays on its rank's line, a marker of its own
(in the legend, with a hover) says what happened in it, and the note under
the chart counts them."""

from __future__ import annotations

from pathlib import Path

from bokeh.models import GlyphRenderer, MultiLine

from torchlens.analysis.ranks import series as series_mod
from torchlens.analysis.ranks.series import RECOMPILED, SKIPPED, step_series
from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest, RankEntry
from torchlens.formats.run_folder.records import collected_steps, write_steps
from torchlens.render.runs.steps_chart import sections, steps_figure

SKIPS = {1: (4, 11, 12)}  # rank -> steps the loss scaler skipped
RECOMPILES = {0: (7,)}  # rank -> steps that recompiled


def _records(rank: int) -> list[dict]:
    out, t = [], 1000.0
    for i in range(20):
        rec = {"step": i, "t0": t, "t1": t + 0.030}
        if i in SKIPS.get(rank, ()):
            rec["scaler"] = {"steps": 1, "skipped": 1, "scale": 1024.0}
        elif rank in SKIPS:
            rec["scaler"] = {"steps": 1, "skipped": 0, "scale": 1024.0}
        if i in RECOMPILES.get(rank, ()):
            rec["compiled"] = {"frames": [{"compile_id": "0/1", "frame": "forward", "file": "net.py", "line": 41,
                                           "compile_s": 0.4,
                                           "recompile_reason": "size mismatch at index 0"}]}
            rec["t1"] += 0.4
        if i == 0:  # a first compile: no recompile
            rec["compiled"] = {"frames": [{"compile_id": "0/0", "frame": "forward", "file": "net.py", "line": 41,
                                           "compile_s": 1.0}]}
        out.append(rec)
        t = rec["t1"] + 0.001
    return out


def _series(tmp_path: Path):
    m = Manifest(world_size=2, source=SOURCE_RUN, started=999.0,
                 ranks=[RankEntry(rank=0), RankEntry(rank=1)])
    for r in range(2):
        write_steps(str(tmp_path), r, _records(r))
    return step_series(collected_steps(str(tmp_path), m))


def test_skipped_and_recompiled_steps_are_marked_where_they_happened(tmp_path: Path) -> None:
    series = _series(tmp_path)
    assert [(s, k) for s, k in zip(series.ranks["1"].marked.step, series.ranks["1"].marked.mark,
                                   strict=True)] == [(s, SKIPPED) for s in SKIPS[1]]
    assert series.ranks["0"].marked.step == [7] and series.ranks["0"].marked.mark == [RECOMPILED]
    fig = steps_figure(series)
    legend = {getattr(item.label, "value", None) for item in fig.legend[0].items}
    assert {SKIPPED, RECOMPILED} <= legend, legend
    marks = {r.data_source.data["mark"][0]: r for r in fig.renderers
             if isinstance(r, GlyphRenderer) and "mark" in r.data_source.data}
    assert list(marks[SKIPPED].data_source.data["step"]) == list(SKIPS[1])
    assert list(marks[RECOMPILED].data_source.data["ms"]) == [430.0]  # the step's own time
    # 14 times the others' steps: above the axis, so its star sits at the axis' top
    assert 30.0 < marks[RECOMPILED].data_source.data["y"][0] < 430.0
    lines = [r for r in fig.renderers if isinstance(r, GlyphRenderer)
             and isinstance(r.glyph, MultiLine)]
    assert sum(len(ys) for r in lines for ys in r.data_source.data["ys"]) == 40  # still steps


def test_the_note_counts_the_marks_and_what_was_left_off(tmp_path: Path, monkeypatch) -> None:
    figures: list = []
    text = str(sections(_series(tmp_path), figures)[0])
    assert f"4 steps marked ({SKIPPED}, {RECOMPILED})" in text, text
    monkeypatch.setattr(series_mod, "MAX_MARKS", 2)
    text = str(sections(_series(tmp_path), figures)[0])
    assert "3 steps marked" in text and "1 more not marked" in text, text


def test_a_run_without_marks_has_no_mark_legend(tmp_path: Path) -> None:
    m = Manifest(world_size=1, source=SOURCE_RUN, started=999.0, ranks=[RankEntry(rank=0)])
    write_steps(str(tmp_path), 0, [{"step": i, "t0": 1000.0 + i, "t1": 1000.5 + i}
                                   for i in range(5)])
    fig = steps_figure(step_series(collected_steps(str(tmp_path), m)))
    legend = {getattr(item.label, "value", None) for item in fig.legend[0].items}
    assert not legend & {SKIPPED, RECOMPILED}
