"""An ended notebook run's "Allocator memory per rank" block under a running
``torchlens run`` job: once the `%ddp_check --profile` run
ended, its section moved below "torchrun jobs", and its block ("allocated
11.5 KiB") sat right under the running job's rank rows without saying which run
it belonged to, so it read as the job's figures. Its title now names its run, and
the moved section is set apart from the jobs list by a rule above it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_harness import Lab, start_lab, stop_lab
from ranks.live_doc import four_rank_view, live_document, write_live
from test_gpu_monitor_sidebar import PANEL, open_panel
from test_rank_chart import post_ranks, profiled_cpu_samples
from test_sidebar_ended_run import ORDER_JS

from torchlens.frontends.ranks import registry as reg

pytestmark = pytest.mark.slow
SHOTS = Path(os.environ.get("TORCHLENS_SCREENSHOTS", "/tmp"))
MiB = 1024**2
RUN = "%ddp_check 13:00:00"
JOB_ID = "7c7c7c7c7c7c7c7c"

#: the rank section's top rule, as drawn
RULE_JS = """() => {
  const style = getComputedStyle(document.querySelector('PANEL .tl-ranks'));
  return [style.borderTopStyle, parseFloat(style.borderTopWidth)];
}""".replace("PANEL", PANEL)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("registry") / "runs"
    before = os.environ.get(reg.ENV_DIR)
    os.environ[reg.ENV_DIR] = str(folder)  # start_lab passes our environment on
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop(reg.ENV_DIR, None)
        else:
            os.environ[reg.ENV_DIR] = before


@pytest.fixture(scope="module")
def lab(registry: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    server = start_lab(tmp_path_factory.mktemp("lab-ended-run-memory"))
    try:
        yield server
    finally:
        stop_lab(server)


def test_ended_runs_allocator_block_names_its_run_below_a_running_job(
        lab: Lab, registry: Path, chromium: Any, tmp_path: Path) -> None:
    # the running torchrun job of the walk: two CPU ranks (modelled figures and RSS)
    job = live_document(four_rank_view(), JOB_ID)
    job["ranks"] = job["ranks"][:2]
    for row, allocated in zip(job["ranks"], (80 * 1024, 4096), strict=True):
        row.update(allocated=allocated, reserved=2 * MiB, rss=320 * MiB, source="modelled")
    write_live(tmp_path, job)
    entry = reg.register(JOB_ID, str(tmp_path), "127.0.0.1:41236", ["torchrun", "fsdp2.py"])
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        page.locator(f'{PANEL} .tl-run[data-run-id="{JOB_ID}"] tr.tl-run-rank').first.wait_for(
            timeout=30_000)
        # a `%ddp_check --profile` run whose last samples are a minute old: ended
        post_ranks(lab, RUN, profiled_cpu_samples(time.time() - 60))
        page.locator(f"{PANEL} .tl-rank-state[data-state='stale']").wait_for(timeout=30_000)
        page.locator(f"{PANEL} .tl-rank-mem .tl-rank-mem-row").nth(1).wait_for(timeout=30_000)
        page.wait_for_timeout(500)
        page.locator(f"{PANEL} .tl-rank-mem").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOTS / "sidebar-ended-run-memory.png"))
        assert page.evaluate(ORDER_JS) == "jobs first"

        title = page.locator(f"{PANEL} .tl-rank-mem-title").inner_text()
        assert title == f"Allocator memory per rank (latest step) of {RUN}", title
        # set apart from the jobs list above it: a rule across the panel
        style, width = page.evaluate(RULE_JS)
        assert style == "solid" and width >= 1, (style, width)
    finally:
        reg.unregister(entry)
        page.close()
