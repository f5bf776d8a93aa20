"""The sidebar's rank chart names the quantity its line draws and labels its
axis in the report's units, in Chromium against JupyterLab.

A ``%ddp_check --profile`` run on CPU posts heartbeats whose figure is the
rank's resident memory with no ``source`` (``live_publish`` sends RSS as
``allocated`` when there is no CUDA device): the title must say RSS, as the
report does, while it runs. A cell whose memory peaks at 155.5 MiB gets tick
labels in MiB ("64 MiB", "128 MiB"), as its report writes 155.5 MiB, not
"0.063 GiB".
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lab_harness import Lab, start_lab, stop_lab
from test_gpu_monitor_sidebar import PANEL, open_panel
from test_rank_chart import post_ranks

pytestmark = pytest.mark.slow

MiB = 1024**2
CHART = f"{PANEL} .tl-ranks .tl-chart"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    server = start_lab(tmp_path_factory.mktemp("lab-rank-words"))
    try:
        yield server
    finally:
        stop_lab(server)


def _state(page: Any) -> tuple[str, list[str]]:
    chart = page.locator(CHART)
    return (chart.locator(".u-title").inner_text(),
            (chart.get_attribute("data-y-ticks") or "").split("|"))


def test_rank_chart_title_and_units_match_the_report(lab: Lab, chromium: Any) -> None:
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        now = time.time()
        # CPU heartbeats of two ranks (~300 MiB RSS), and the modelled figures
        # of their profiled steps, which are text only
        heartbeats = [{"rank": r, "t": now - 10 + i / 2, "device": None, "reserved": None,
                       "allocated": (290 + r * 20 + i % 3) * MiB} for i in range(16) for r in (0, 1)]
        modelled = [{"rank": r, "t": now - 9, "device": None, "allocated": 11 * 1024,
                     "reserved": 2 * MiB, "inactive_split": 0, "largest_free": MiB,
                     "source": "modelled"} for r in (0, 1)]
        post_ranks(lab, "%ddp_check 13:00:00", modelled + heartbeats)
        page.locator(CHART).wait_for(timeout=30_000)
        page.wait_for_timeout(1200)
        title, _ = _state(page)
        assert "resident memory (RSS)" in title and "allocated" not in title, title

        # a cell whose line peaks at 155.5 MiB: ticks in MiB, short and distinct
        run = "%%gpumem 13:01:35"
        samples = [{"rank": 0, "t": now - 8 + i / 2, "device": None, "reserved": None,
                    "source": "rss", "allocated": int(min(i * 16, 155.5) * MiB)} for i in range(12)]
        post_ranks(lab, run, samples)
        page.wait_for_function(
            f"document.querySelector('{CHART} .u-title')?.innerText.includes('13:01:35')",
            timeout=30_000)
        page.wait_for_timeout(1200)
        title, ticks = _state(page)
        assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), ticks
        assert all(re.fullmatch(r"\d+ MiB", t) for t in ticks), ticks
        assert "64 MiB" in ticks or "128 MiB" in ticks or "100 MiB" in ticks, ticks
    finally:
        page.close()
