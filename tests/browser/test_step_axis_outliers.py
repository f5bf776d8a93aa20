"""One spike does not flatten the step-time lines.

A 350 ms step among 55 ms ones fitted the step chart's axis to itself, so the
lines sat flat at the bottom (the live view, ``torchlens.watch`` and the run
report's "every step over time"). Now the axis runs to 1.5x the 99th
percentile, the spike leaves through the top with a red mark at the edge, and
the chart says what is off the axis. Read in Chromium: the ranges BokehJS
computed, and the words above the plot.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bokeh.embed import file_html
from bokeh.resources import INLINE

from torchlens.model.payloads import RankProfiling, RankSeries, StepSeries
from torchlens.render.ranks.view import rank_profile_figures
from torchlens.render.runs.steps_chart import steps_figure

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ranks.rank_fixtures import T_START, make_run  # noqa: E402

SPIKE_STEP, SPIKE_MS = 25, 350.0
Y_RANGE_JS = """(prefix) => {
  const views = [];
  const walk = (v) => { views.push(v); for (const c of (v.child_views || [])) walk(c); };
  for (const v of Object.values(window.Bokeh.index)) walk(v);
  const p = views.find((v) => v.model.title && String(v.model.title.text).startsWith(prefix));
  const above = p.model.above.filter((m) => m.type === 'Title').map((m) => m.text);
  return [p.model.y_range.start, p.model.y_range.end, above];
}"""


def _read(chromium: Any, layout: Any, tmp_path: Path, prefix: str) -> tuple[Any, list[str]]:
    path = tmp_path / "chart.html"
    path.write_text(file_html(layout, INLINE, "chart"), encoding="utf-8")
    page = chromium.new_page()
    messages: list[str] = []
    page.on("console", lambda m: messages.append(m.text)  # not WebGL's driver notes
            if m.type in ("warning", "error") and "GL Driver" not in m.text else None)
    try:
        page.goto(path.as_uri())
        page.wait_for_function("() => window.Bokeh && Object.keys(window.Bokeh.index).length > 0")
        page.wait_for_timeout(800)
        y0, y1, above = page.evaluate(Y_RANGE_JS, prefix)
    finally:
        page.close()
    assert messages == [], messages
    return (y0, y1), above


def _check(y: tuple[float, float], above: list[str], where: str) -> None:
    assert y[1] < 0.6 * SPIKE_MS, f"the axis runs to {y[1]:.0f} ms: the lines are flat"
    assert y[1] > 140, y  # every other step (up to ~126 ms) is still on the axis
    assert f"1 step above the axis: {SPIKE_MS:,.1f} ms at {where}" in above, above


def test_the_rank_views_step_chart_keeps_its_lines_readable(chromium: Any,
                                                           tmp_path: Path) -> None:
    steps, summaries = make_run(world=2, steps=60)
    rec = steps[1][SPIKE_STEP]
    steps[1][SPIKE_STEP] = rec.replace(t1=rec.t0 + SPIKE_MS / 1e3)
    layout = rank_profile_figures(RankProfiling(every=5, steps=steps, summaries=summaries), 2,
                                  T_START)
    y, above = _read(chromium, layout, tmp_path, "Step time")
    _check(y, above, f"step {SPIKE_STEP} (rank 1)")


def test_the_run_reports_steps_over_time_keeps_its_lines_readable(chromium: Any,
                                                                 tmp_path: Path) -> None:
    ms = [55.0 + (i * 7) % 9 for i in range(200)]
    ms[SPIKE_STEP] = SPIKE_MS
    series = StepSeries(ranks={"0": RankSeries(t=[0.06 * i for i in range(200)], ms=ms,
                                              step=list(range(200)), restart=[0] * 200)})
    y, above = _read(chromium, steps_figure(series), tmp_path, "Every step")
    assert y[1] < 0.5 * SPIKE_MS and y[1] > 63, y
    assert f"1 step above the axis: {SPIKE_MS:,.1f} ms at step {SPIKE_STEP} (rank 0)" in above
