"""An ended run's rank chart in the GPU Monitor sidebar: it
no longer sits above the "torchrun jobs" section, where a `%ddp_check` that
ended minutes ago pushed a running job below the fold; and its words give the
time as its axis does (the text said ``10:06:16 PM`` under an axis of
``22:06:15``). A new live run's chart goes back above the jobs."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_harness import Lab, start_lab, stop_lab
from test_gpu_monitor_sidebar import PANEL, open_panel
from test_rank_chart import ddp_like_samples, post_ranks

pytestmark = pytest.mark.slow
SHOTS = Path(os.environ.get("TORCHLENS_SCREENSHOTS", "/tmp"))

CLOCK = r"\d\d:\d\d:\d\d"
#: which of the rank chart and the jobs section comes first in the panel
ORDER_JS = """() => {
  const ranks = document.querySelector('PANEL .tl-ranks');
  const runs = document.querySelector('PANEL .tl-runs');
  return ranks.compareDocumentPosition(runs) & Node.DOCUMENT_POSITION_FOLLOWING ? 'ranks first'
                                                                                : 'jobs first';
}""".replace("PANEL", PANEL)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    server = start_lab(tmp_path_factory.mktemp("lab-ended-run"))
    try:
        yield server
    finally:
        stop_lab(server)


def test_an_ended_run_goes_below_the_jobs_and_tells_time_as_its_axis(lab: Lab,
                                                                     chromium: Any) -> None:
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        # a run whose last heartbeat was 60 s ago: stale at the next host sample
        post_ranks(lab, "%ddp_check 22:00:00", ddp_like_samples(time.time() - 60))
        state = page.locator(f"{PANEL} .tl-rank-state[data-state='stale']")
        state.wait_for(timeout=30_000)
        page.wait_for_timeout(500)
        page.screenshot(path=str(SHOTS / "sidebar-ended-run.png"))
        assert page.evaluate(ORDER_JS) == "jobs first"
        words = state.inner_text()
        assert re.search(rf"no memory sample since {CLOCK}: ", words), words
        assert not re.search(r"\b(AM|PM)\b", words), words
        footer = page.locator(f"{PANEL} .tl-footer").inner_text()
        assert re.search(rf"last {CLOCK}$", footer) and "M" not in footer.split("last")[1], footer
        ticks = page.locator(f"{PANEL} .tl-ranks .tl-chart").get_attribute("data-x-ticks") or ""
        assert ticks and all(re.fullmatch(CLOCK, t) for t in ticks.split("|")), ticks
        # a live run: its chart goes back under the GPUs, above the jobs
        post_ranks(lab, "%ddp_check 22:10:00", ddp_like_samples(time.time(), seconds=5))
        page.wait_for_function(f"() => ({ORDER_JS})() === 'ranks first'", timeout=30_000)
    finally:
        page.close()
