"""The per-rank state lanes (the heartbeats' phases over time)
draw consecutive spans touching, with no pale seam between them: a seam reads
as a moment the rank sent nothing."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from bokeh.embed import file_html
from bokeh.resources import INLINE

from torchlens.model.messages import DdpHeartbeat
from torchlens.render.ddp.heartbeats import PHASE_COLORS, LivePlot, rank_figures

# rank 0's lane: where its first span starts and its last ends, and the row's y, in page pixels
LANE_JS = """() => {
  const views = [];
  const walk = (v) => { views.push(v); for (const c of (v.child_views || [])) walk(c); };
  for (const v of Object.values(window.Bokeh.index)) walk(v);
  const p = views.find((v) => v.model.title && String(v.model.title.text).startsWith('Per-rank timeline'));
  const box = p.el.getBoundingClientRect();
  const {x_scale, y_scale} = p.frame;
  return {x0: box.left + x_scale.compute(%f), x1: box.left + x_scale.compute(%f),
          y: box.top + y_scale.compute(0)};
}"""


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def _layout(beats: list[DdpHeartbeat], live: bool) -> Any:
    if not live:  # the report
        return rank_figures(beats, 2)
    plot = LivePlot(2)  # the live view: a span per heartbeat, as they arrive
    for hb in beats:
        plot.push(hb)
        plot.flush(force=True)
    return plot.layout


@pytest.mark.parametrize("live", [False, True], ids=["report", "live"])
def test_consecutive_state_spans_touch(chromium: Any, tmp_path: Path, live: bool) -> None:
    from PIL import Image

    phases = ["step", "checksums"]  # a new phase every second heartbeat
    beats = [DdpHeartbeat(t_rel=0.37 * i, rank=r, phase=phases[(i // 2) % 2], rss=2**28)
             for i in range(40) for r in (0, 1)]
    layout = _layout(beats, live)
    path = tmp_path / "lanes.html"
    path.write_text(file_html(layout, INLINE, "lanes"), encoding="utf-8")
    page = chromium.new_page()
    page.set_viewport_size({"width": 1300, "height": 900})
    try:
        page.goto(path.as_uri())
        page.wait_for_function("() => window.Bokeh && Object.keys(window.Bokeh.index).length > 0")
        page.wait_for_timeout(800)
        lane = page.evaluate(LANE_JS % (0.0, 0.37 * 39))
        shot = Image.open(io.BytesIO(page.screenshot(full_page=True))).convert("RGB")
    finally:
        page.close()
    colours = [_rgb(PHASE_COLORS[p]) for p in phases]
    lightest = max(sum(c) for c in colours)
    y = round(lane["y"])
    row = [shot.getpixel((x, y)) for x in range(round(lane["x0"]) + 2, round(lane["x1"]) - 2)]
    seams = [x for x, px in enumerate(row) if sum(px) > lightest + 30]
    assert len(row) > 300, lane
    assert not seams, f"{len(seams)} pale pixels between spans on rank 0's lane, at {seams[:10]}"
