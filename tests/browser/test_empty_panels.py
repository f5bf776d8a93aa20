"""The panels of ``%ddp_check --profile``'s live view
and of ``torchlens.watch`` as they open, before the ranks' first steps.

A walk saw them open on -1..1 axes (negative milliseconds), and BokehJS
logged "could not set initial ranges" 22 to 62 times per notebook: the
watch's widget had no placeholder range at all, and the allocator panels of
a run that measures no allocator get rows of NaN only, which drew nothing and
dropped the placeholder. Here: no warning as the view opens and after NaN
rows arrive, and no axis of ms, MiB, %, counts, steps or seconds below 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bokeh.embed import file_html
from bokeh.resources import INLINE

from torchlens.frontends.ranks.watch import Watch
from torchlens.frontends.shared.live_view import ProfiledLiveView

ipywidgets = pytest.importorskip("ipywidgets")

#: memory columns a run without an allocator (no CUDA, no model) sends as NaN
NAN_COLUMNS = ("allocated", "reserved", "inactive", "frag", "free")
STREAM_NAN_JS = """(nan_cols) => {
  const doc = Object.values(Bokeh.index)[0].model.document;
  for (const m of doc._all_models.values()) {
    if (m.type !== 'ColumnDataSource' || m.get_length() !== 0) continue;
    const keys = Object.keys(m.data);
    if (!keys.includes('allocated')) continue;
    const cols = {};
    for (const k of keys) cols[k] = nan_cols.includes(k) ? [NaN, NaN] : [5, 6];
    m.stream(cols);
  }
}"""
RANGES_JS = """() => {
  const views = [];
  const walk = (v) => { views.push(v); for (const c of (v.child_views || [])) walk(c); };
  for (const v of Object.values(window.Bokeh.index)) walk(v);
  return views.filter((v) => v.model.x_range && v.model.y_range && v.model.visible).map((v) => [
    v.model.title ? String(v.model.title.text) : '', v.model.x_range.start, v.model.y_range.start,
    v.model.y_range.end]);
}"""


def _open(chromium: Any, layout: Any, tmp_path: Path, name: str) -> tuple[Any, list[str]]:
    path = tmp_path / f"{name}.html"
    path.write_text(file_html(layout, INLINE, name), encoding="utf-8")
    page = chromium.new_page()
    messages: list[str] = []
    page.on("console", lambda m: messages.append(f"{m.type}: {m.text}")
            if m.type in ("warning", "error") else None)
    page.goto(path.as_uri())
    page.wait_for_function("() => window.Bokeh && Object.keys(window.Bokeh.index).length > 0")
    page.wait_for_timeout(800)
    return page, messages


def _ddp_check_view() -> Any:
    view = ProfiledLiveView(2, 10, modelled=False)
    assert view.widget is not None  # what %ddp_check sends
    return view.layout


def _watch_view() -> Any:
    w = Watch(source=None, label="run", timeout=1.0)
    w._new_view(2)
    assert w.widget is not None  # what torchlens.watch sends
    return w.view.layout


@pytest.mark.parametrize("make", [_ddp_check_view, _watch_view], ids=["ddp_check", "watch"])
def test_panels_open_on_axes_from_zero_without_warnings(chromium: Any, tmp_path: Path,
                                                        make: Any) -> None:
    page, messages = _open(chromium, make(), tmp_path, make.__name__)
    try:
        opened = page.evaluate(RANGES_JS)
        assert messages == [], messages
        page.evaluate(STREAM_NAN_JS, list(NAN_COLUMNS))
        page.wait_for_timeout(600)
    finally:
        page.close()
    assert messages == [], messages
    # a lane chart's y is its ranks (rank 0's lane is centred on 0)
    below = [(title, x0, y0) for title, x0, y0, _ in opened
             if x0 < 0 or (y0 < 0 and "timeline" not in title and "profiled step" not in title)]
    assert len(opened) >= 8 and below == [], (below, opened)

