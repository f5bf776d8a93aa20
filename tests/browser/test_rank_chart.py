"""The sidebar's per-rank memory chart, fed through the server's /ranks endpoint.

What a user sees: the chart fills the panel's width and a good part of its
height, its y-axis tick labels (with units) are drawn whole (no clipped
".225"), it has a time axis, and its labels are dark enough to read. With
``%ddp_check --profile`` each rank's allocator figures (allocated, reserved,
fragmentation, largest free block) are listed under the chart, their source
said plainly ("modelled" on CPU).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
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
        # without --profile's allocator figures there is no per-rank memory block
        mem = page.locator(f"{PANEL} .tl-rank-mem")
        assert mem.locator("*").count() == 0 and not mem.is_visible()
    finally:
        page.close()


MiB = 1024**2


def profiled_cpu_samples(now: float) -> list[dict[str, Any]]:
    """A CPU ``--profile`` run: heartbeats (resident memory, the line) every
    half second, and each rank's profiled-step summary (the allocator model)."""
    out = []
    for i in range(20):
        t = now - 10 + i / 2
        out += [{"rank": r, "t": t, "device": None, "allocated": (400 + 10 * r + i) * MiB,
                 "reserved": None} for r in (0, 1)]
    t = now - 0.2
    out += [
        {"rank": 0, "t": t, "device": None, "allocated": 180 * MiB, "reserved": 256 * MiB,
         "inactive_split": 18 * MiB, "largest_free": 40 * MiB, "source": "modelled"},
        {"rank": 1, "t": t, "device": None, "allocated": 96 * MiB, "reserved": 128 * MiB,
         "inactive_split": 1536 * 1024, "largest_free": 30 * MiB, "source": "modelled"},
    ]
    return out


def metrics(row: Any) -> dict[str, str]:
    """A rank row's figures: metric -> the text of its value cell."""
    cells = row.locator("tr[data-metric]")
    return {cells.nth(i).get_attribute("data-metric"): cells.nth(i).locator("td").nth(1)
            .inner_text().strip() for i in range(cells.count())}


def test_profiled_ranks_show_allocator_memory_and_fragmentation(
    lab: Lab, chromium: Any
) -> None:
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        post_ranks(lab, "%ddp_check step --profile", profiled_cpu_samples(time.time()))
        rows = page.locator(f"{PANEL} .tl-rank-mem .tl-rank-mem-row")
        rows.nth(1).wait_for(timeout=30_000)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(SHOTS / "rank-memory-modelled.png"))
        # the block itself, scrolled into view (the panel scrolls below the chart)
        page.locator(f"{PANEL} .tl-rank-mem").screenshot(
            path=str(SHOTS / "rank-memory-modelled-block.png"))
        assert rows.count() == 2
        zero = rows.nth(0)
        assert zero.get_attribute("data-rank") == "0"
        assert zero.get_attribute("data-source") == "modelled"
        # the source said plainly: a tag on each rank, a sentence under the title
        assert zero.locator(".tl-rank-source").inner_text() == "modelled (CPU)"
        note = page.locator(f"{PANEL} .tl-rank-mem-note").inner_text()
        assert note.startswith("Modelled, not measured: a CPU run has no CUDA allocator"), note
        # every figure with its unit, as the Python reports write it (model/units.py)
        assert metrics(zero) == {
            "allocated": "180.0 MiB of 256.0 MiB reserved",
            "fragmentation": "7% · 18.0 MiB inactive split",
            "largest_free": "40.0 MiB"}
        assert metrics(rows.nth(1)) == {
            "allocated": "96.0 MiB of 128.0 MiB reserved",
            "fragmentation": "1% · 1.5 MiB inactive split",
            "largest_free": "30.0 MiB"}
        # the bar: allocated and inactive split as shares of reserved
        alloc = zero.locator(".tl-bar-alloc").bounding_box()
        split = zero.locator(".tl-bar-split").bounding_box()
        bar = zero.locator(".tl-rank-bar").bounding_box()
        assert alloc and split and bar
        assert abs(alloc["width"] / bar["width"] - 180 / 256) < 0.03, (alloc, bar)
        assert abs(split["width"] / bar["width"] - 18 / 256) < 0.03, (split, bar)
        # the modelled figures are text only: the line is still resident memory
        ticks = (page.locator(f"{PANEL} .tl-ranks .tl-chart").get_attribute(
            "data-y-ticks") or "")
        values = [float(v.split()[0]) for v in ticks.split("|") if v.endswith(" MiB")]
        assert values and min(values) > 300, ticks  # 400-430 MiB, never down to 96

        # a posted value is never markup: the server refuses it, the page has no <img>
        bad = {"rank": 0, "t": time.time(), "allocated": 1,
               "source": '<img src=x onerror="document.title=1">'}
        with pytest.raises(urllib.error.HTTPError) as err:
            post_ranks(lab, "%ddp_check step --profile", [bad])
        assert err.value.code == 400
        assert page.locator(f"{PANEL} .tl-rank-mem img").count() == 0

        # a CUDA run: measured, no largest free block without a snapshot
        now = time.time()
        post_ranks(lab, "%ddp_check cuda --profile", [
            {"rank": r, "t": now, "device": r, "allocated": int((3 + 0.5 * r) * GiB),
             "reserved": 4 * GiB, "inactive_split": 300 * MiB, "largest_free": None,
             "source": "cuda"} for r in (0, 1)])
        page.locator(f"{PANEL} .tl-rank-mem-row[data-source='cuda']").nth(1).wait_for(
            timeout=30_000)
        assert rows.count() == 2  # a new run: the modelled rows are gone
        page.wait_for_timeout(500)
        page.screenshot(path=str(SHOTS / "rank-memory-cuda.png"))
        assert rows.nth(0).locator(".tl-rank-source").inner_text() == "CUDA"
        notes = page.locator(f"{PANEL} .tl-rank-mem-note")
        assert notes.count() == 1 and notes.get_attribute("data-source") == "cuda"
        assert metrics(rows.nth(0)) == {
            "allocated": "3.0 GiB of 4.0 GiB reserved",
            "fragmentation": "7% · 300.0 MiB inactive split",
            "largest_free": "n/a"}
    finally:
        page.close()
