"""The sidebar's per-rank memory chart, fed through the server's /ranks endpoint.

What a user sees: the chart fills the panel's width and a good part of its
height, its y-axis tick labels (with units) are drawn whole (no clipped
".225"), it has a time axis, and its labels are dark enough to read.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_harness import Lab, start_lab, stop_lab
from test_gpu_monitor_sidebar import PANEL, open_panel

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("TORCHLENS_SCREENSHOTS", "/tmp"))
GiB = 1024**3


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    server = start_lab(tmp_path_factory.mktemp("lab-ranks"))
    try:
        yield server
    finally:
        stop_lab(server)


def post_ranks(lab: Lab, run: str, samples: list[dict[str, Any]]) -> None:
    request = urllib.request.Request(
        f"{lab.url}torchlens/monitor/ranks", method="POST",
        data=json.dumps({"run": run, "samples": samples}).encode(),
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30):
        pass


def ddp_like_samples(now: float, seconds: int = 40) -> list[dict[str, Any]]:
    """Two ranks around 0.23 GiB (the values whose labels were clipped)."""
    out = []
    for i in range(seconds * 2):
        t = now - seconds + i / 2
        for rank in (0, 1):
            allocated = int((0.225 + 0.01 * ((i + 7 * rank) % 10) / 10) * GiB)
            out.append({"rank": rank, "t": t, "device": None, "allocated": allocated,
                        "reserved": None})
    return out


# Ink on the chart's canvas outside the plotting area: where the tick labels are.
INK_JS = """
(canvas) => {
  const ctx = canvas.getContext('2d');
  const {width: w, height: h} = canvas;
  const data = ctx.getImageData(0, 0, w, h).data;
  const inkAt = (x, y) => data[4 * (y * w + x) + 3] > 40;
  const column = (x, y0, y1) => { let n = 0; for (let y = y0; y < y1; y++) n += inkAt(x, y); return n; };
  const row = (y, x0, x1) => { let n = 0; for (let x = x0; x < x1; x++) n += inkAt(x, y); return n; };
  // the darkest label pixel (0 = black) in the left axis strip
  let darkest = 255;
  for (let y = 0; y < h; y++) for (let x = 0; x < Math.min(w, 30); x++) {
    const i = 4 * (y * w + x);
    if (data[i + 3] > 200) darkest = Math.min(darkest, (data[i] + data[i + 1] + data[i + 2]) / 3);
  }
  return {w, h, leftEdge: column(0, 0, h) + column(1, 0, h), bottomEdge: row(h - 1, 0, w),
          leftStrip: [...Array(30).keys()].reduce((n, x) => n + column(x, 0, h), 0),
          bottomStrip: [...Array(12).keys()].reduce((n, k) => n + row(h - 2 - k, 0, w), 0),
          darkest};
}
"""


def test_rank_chart_fills_the_panel_with_whole_labels_and_a_time_axis(
    lab: Lab, chromium: Any
) -> None:
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        post_ranks(lab, "%ddp_check step", ddp_like_samples(time.time()))
        chart = page.locator(f"{PANEL} .tl-ranks .tl-chart")
        chart.wait_for(timeout=30_000)
        page.wait_for_timeout(1500)  # a redraw after the last batch
        page.screenshot(path=str(SHOTS / "rank-chart.png"))
        panel = page.locator(PANEL).bounding_box()
        box = chart.bounding_box()
        assert panel and box
        # width: the chart spans (nearly) the whole panel
        assert box["width"] >= 0.9 * panel["width"], (box, panel)
        canvas = chart.locator("canvas").first
        ink = canvas.evaluate(INK_JS)
        # tick labels exist on the left (values) and at the bottom (times) ...
        assert ink["leftStrip"] > 50 and ink["bottomStrip"] > 50, ink
        # ... and none runs off the canvas's left or bottom edge (clipped)
        assert ink["leftEdge"] == 0 and ink["bottomEdge"] == 0, ink
        # readable: label pixels close to the theme's text colour, not faint grey
        assert ink["darkest"] < 110, ink
        # units on the value axis, not bare ".225" (the labels the chart drew)
        ticks = (chart.get_attribute("data-y-ticks") or "").split("|")
        assert len(ticks) >= 2 and all(re.fullmatch(r"\d+(\.\d+)? (MiB|GiB)", t) for t in ticks), ticks
        # height: the chart takes the panel's spare height, not a 120 px strip
        assert box["y"] + box["height"] >= panel["y"] + 0.75 * panel["height"], (box, panel)
    finally:
        page.close()
