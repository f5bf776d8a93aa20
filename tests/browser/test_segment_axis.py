"""The "Segments and blocks" chart's x axis covers the segments
drawn and nothing else (it began at -1 MiB for a 2 MiB segment, the left third
of the chart empty)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torchlens.frontends import kinds
from torchlens.model import load_profile

V1 = Path(__file__).resolve().parents[1] / "data" / "v1"

X_RANGE = """() => {
  const views = [];
  const walk = (v) => { views.push(v); for (const c of (v.child_views || [])) walk(c); };
  for (const v of Object.values(window.Bokeh.index)) walk(v);
  const plot = views.find((v) => v.model.title && String(v.model.title.text).startsWith("Segments"));
  return plot ? [plot.model.x_range.start, plot.model.x_range.end] : null;
}"""


def test_segment_axis_starts_at_zero_and_ends_at_the_largest_segment(chromium: Any,
                                                                      tmp_path: Path) -> None:
    profile = load_profile(V1 / "gpumem.tlprof")  # one 2 MiB segment
    biggest = max(s.total_size for s in kinds.analyze(profile).segments) / 2**20
    page_file = tmp_path / "r.html"
    page_file.write_text(kinds.report_html(profile))
    page = chromium.new_page()
    try:
        page.goto(page_file.as_uri())
        page.wait_for_function("() => window.Bokeh && Object.keys(window.Bokeh.index).length > 0")
        page.wait_for_timeout(500)
        x = page.evaluate(X_RANGE)
    finally:
        page.close()
    assert x is not None, "no segment chart on the page"
    assert x == [0, biggest], f"x axis spans {x} MiB, the segments 0 .. {biggest} MiB"
