"""The sidebar's rank chart keeps a readable number of y tick
labels however tall the panel makes it (a tall panel drew one label every 24 px,
34 labels on a resident-memory line moving by a few KiB), in Chromium against
JupyterLab."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from lab_harness import Lab, start_lab, stop_lab
from test_gpu_monitor_sidebar import PANEL, open_panel
from test_rank_chart import post_ranks

pytestmark = pytest.mark.slow

CHART = f"{PANEL} .tl-ranks .tl-chart"
MAX_TICKS = 8


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    server = start_lab(tmp_path_factory.mktemp("lab-rank-ticks"))
    try:
        yield server
    finally:
        stop_lab(server)


@pytest.mark.parametrize("height", [1400])
def test_rss_chart_has_a_few_readable_ticks(lab: Lab, chromium: Any, height: int) -> None:
    page = chromium.new_page()
    page.set_viewport_size({"width": 1400, "height": height})
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        now = time.time()
        # CPU heartbeats: two ranks' resident memory (~405 MiB) moving by a page or two
        samples = [{"rank": r, "t": now - 20 + i, "device": None, "reserved": None,
                    "allocated": 424_406_528 + 4096 * (i % 3) + 1000 * r}
                   for i in range(20) for r in (0, 1)]
        run = f"%ddp_check 14:00:{height % 60:02d}"
        post_ranks(lab, run, samples)
        page.wait_for_function(
            f"document.querySelector('{CHART} .u-title')?.innerText.includes('{run[-8:]}')",
            timeout=30_000)
        page.wait_for_timeout(1500)
        chart = page.locator(CHART)
        ticks = (chart.get_attribute("data-y-ticks") or "").split("|")
        plot_px = chart.locator(".u-over").bounding_box()["height"]
    finally:
        page.close()
    assert plot_px > 200, plot_px  # the panel did make the chart tall
    assert 2 <= len(ticks) <= MAX_TICKS, f"{len(ticks)} y tick labels on {plot_px:.0f} px: {ticks}"
