"""In a browser: the "Segments and blocks" chart of a capture
with one segment draws its row (it used to be an empty strip)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchlens.frontends import kinds
from torchlens.model import load_profile

V1 = Path(__file__).resolve().parents[1] / "data" / "v1"

FIND = """() => {
  const views = [];
  const walk = (v) => { views.push(v); for (const c of (v.child_views || [])) walk(c); };
  for (const v of Object.values(window.Bokeh.index)) walk(v);
  const plot = views.find((v) => v.model.title && String(v.model.title.text).startsWith("Segments"));
  if (!plot) return null;
  const y = plot.model.y_range;
  return {height: plot.frame.bbox.height, start: y.start, end: y.end,
          glyphs: plot.model.renderers.map((r) => r.data_source.get_length())};
}"""


def test_one_segment_map_draws_its_row(chromium: Any, tmp_path) -> None:
    profile = load_profile(V1 / "gpumem.tlprof")  # one 2 MiB segment
    assert len(kinds.analyze(profile).segments) == 1
    page_file = tmp_path / "r.html"
    page_file.write_text(kinds.report_html(profile))
    page = chromium.new_page()
    try:
        page.goto(page_file.as_uri())
        page.wait_for_function("() => window.Bokeh && Object.keys(window.Bokeh.index).length > 0")
        page.wait_for_timeout(500)
        info = page.evaluate(FIND)
    finally:
        page.close()
    assert info is not None, "no segment chart on the page"
    assert info["height"] >= 16, info  # the row has room on screen
    assert min(info["start"], info["end"]) <= 0 <= max(info["start"], info["end"]), info
    assert sum(info["glyphs"]) >= 1, info  # blocks drawn
