"""The sidebar's memory chart for a ``%%gpumem`` cell, and its wording, in Chromium.

What a user sees: while a CPU cell runs the line is its resident
memory, named so; when the cell ends the line is the figure its report shows
(peak allocated), the axis covers that data with tick labels that differ, and
the chart says the cell finished. The "Allocator memory per rank" block shows
its bar key only above bars, and the jobs section counts ranks in one wording.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from lab_harness import Lab, start_lab, stop_lab

# tests/ is on sys.path (pytest puts tests/conftest.py's folder there)
from ranks.live_doc import live_document, write_live
from test_gpu_monitor_sidebar import PANEL, open_panel
from test_rank_chart import post_ranks

from torchlens.analysis.ranks.verdict import run_view
from torchlens.frontends.ranks import registry as reg
from torchlens.frontends.shared.live_publish import report_samples
from torchlens.model.units import format_bytes

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("TORCHLENS_SCREENSHOTS", "/tmp"))
MiB = 1024**2
CHART = f"{PANEL} .tl-ranks .tl-chart"


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
    server = start_lab(tmp_path_factory.mktemp("lab-gpumem"))
    try:
        yield server
    finally:
        stop_lab(server)


@pytest.fixture(scope="module")
def cell() -> Any:
    """A real CPU ``%%gpumem`` cell's analysis: a few MiB allocated, some freed."""
    import torch

    import torchlens

    with torchlens.gpumem(stacks=0) as result:
        kept = [torch.ones(256, 1024) for _ in range(6)]
        del kept[:3]
    return result.analysis()


def chart_state(page: Any) -> dict[str, Any]:
    chart = page.locator(CHART)
    ticks = (chart.get_attribute("data-y-ticks") or "").split("|")
    return {"ticks": ticks, "title": chart.locator(".u-title").inner_text(),
            **{k: float(chart.get_attribute(f"data-{k}") or "nan")
               for k in ("y-min", "y-max", "data-min", "data-max")}}


def assert_axis_fits(state: dict[str, Any]) -> None:
    # the axis covers the data it draws ...
    assert state["y-min"] <= state["data-min"] and state["y-max"] >= state["data-max"], state
    # ... and not much else: the data spans at least a third of it
    span = state["y-max"] - state["y-min"]
    assert state["data-max"] - state["data-min"] >= span / 3 or span < 1, state
    # every tick label differs (no "424.406 MiB" down the axis)
    assert len(state["ticks"]) >= 2 and len(set(state["ticks"])) == len(state["ticks"]), state


def test_gpumem_chart_draws_the_reports_figure_and_says_the_cell_finished(
    lab: Lab, chromium: Any, cell: Any
) -> None:
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        run = "%%gpumem 12:00:00"
        # while the cell runs: resident memory, about 424 MiB moving by a few KiB
        now = time.time()
        started = now - 6
        live = [{"rank": 0, "t": started + i / 2, "device": None, "source": "rss",
                 "allocated": 424 * MiB + 416 * 1024 + 512 * (i % 5), "reserved": None}
                for i in range(10)]
        post_ranks(lab, run, live)
        page.locator(CHART).wait_for(timeout=30_000)
        page.wait_for_timeout(1200)
        page.screenshot(path=str(SHOTS / "gpumem-sidebar-live.png"))
        state = chart_state(page)
        assert "resident memory (RSS)" in state["title"], state
        assert_axis_fits(state)

        # the cell ends: its report's figures replace the live line
        final = msgspec.to_builtins(report_samples(cell, started, now))
        post_ranks(lab, run, final)
        page.locator(f'{PANEL} .tl-rank-state[data-state="finished"]').wait_for(timeout=30_000)
        page.wait_for_timeout(1200)
        page.screenshot(path=str(SHOTS / "gpumem-sidebar-finished.png"))
        state = chart_state(page)
        peak = cell.timeline.peak_allocated
        assert state["data-max"] == peak, (state, peak)  # the report's peak, not RSS
        assert state["title"] == f"{run}: allocated memory, as in its report", state
        assert_axis_fits(state)
        words = page.locator(f"{PANEL} .tl-rank-state").inner_text()
        assert f"peak {format_bytes(peak)} allocated" in words, words
        # a late live sample does not bring the resident memory back
        post_ranks(lab, run, [{**live[-1], "t": time.time()}])
        page.wait_for_timeout(1500)
        assert chart_state(page)["data-max"] == peak
    finally:
        page.close()


def test_a_run_whose_samples_stopped_is_marked_stale(lab: Lab, chromium: Any) -> None:
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        t = time.time() - 30  # the run's last sample was 30 s ago
        post_ranks(lab, "%ddp_check old", [{"rank": r, "t": t, "device": None,
                                            "allocated": (100 + r) * MiB, "reserved": None}
                                           for r in (0, 1)])
        stale = page.locator(f'{PANEL} .tl-rank-state[data-state="stale"]')
        stale.wait_for(timeout=30_000)
        assert stale.inner_text().startswith("no memory sample since")
    finally:
        page.close()


def test_allocator_block_shows_its_bar_key_only_above_bars(lab: Lab, chromium: Any) -> None:
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        t = time.time()
        # figures without reserved memory: no bar, so no key to the bars
        post_ranks(lab, "%ddp_check nobar", [
            {"rank": r, "t": t, "device": 0, "allocated": 5 * MiB, "reserved": None,
             "inactive_split": None, "largest_free": None, "source": "cuda"} for r in (0, 1)])
        rows = page.locator(f"{PANEL} .tl-rank-mem .tl-rank-mem-row")
        rows.nth(1).wait_for(timeout=30_000)
        page.locator(f"{PANEL} .tl-rank-mem").screenshot(path=str(SHOTS / "rank-mem-nobar.png"))
        assert page.locator(f"{PANEL} .tl-rank-mem-legend").count() == 0
        assert page.locator(f"{PANEL} .tl-rank-bar").count() == 0
        # with reserved memory: bars, and their key above them
        post_ranks(lab, "%ddp_check bars", [
            {"rank": r, "t": t + 1, "device": 0, "allocated": 5 * MiB, "reserved": 8 * MiB,
             "inactive_split": MiB, "largest_free": 2 * MiB, "source": "cuda"} for r in (0, 1)])
        page.locator(f"{PANEL} .tl-rank-bar").nth(1).wait_for(timeout=30_000)
        legend = page.locator(f"{PANEL} .tl-rank-mem-legend")
        assert legend.count() == 1
        assert legend.inner_text().split() == ["allocated", "inactive", "split", "free"]
    finally:
        page.close()


def test_jobs_section_counts_ranks_in_one_wording(
    lab: Lab, registry: Path, chromium: Any, tmp_path: Path
) -> None:
    page = chromium.new_page()
    entry = None
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        run_dir = tmp_path / "waiting"
        run_dir.mkdir()
        entry = reg.register("0f0f0f0f0f0f0f0f", str(run_dir), "127.0.0.1:41234",
                             ["torchrun", "train.py"])
        # no rank has attached and the world size is not known yet
        view = run_view({"world_size": 0, "ranks": [], "steps": [], "summaries": [],
                         "dropped": 0, "restarts": [], "lost_after_s": 10.0})
        write_live(run_dir, live_document(view, "0f0f0f0f0f0f0f0f"))
        card = page.locator(f'{PANEL} .tl-run[data-run-id="0f0f0f0f0f0f0f0f"]')
        page.wait_for_selector(f'{PANEL} .tl-run[data-state="running"]', timeout=30_000)
        text = card.inner_text()
        page.locator(f"{PANEL} .tl-runs").screenshot(path=str(SHOTS / "runs-waiting.png"))
        assert "0 of ? ranks attached" in text, text
        assert text.count(" ranks") == 1 and "0 of 0" not in text and "node(s)" not in text, text
    finally:
        reg.unregister(entry)
        page.close()
