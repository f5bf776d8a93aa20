"""The sidebar's "torchrun jobs" section in a real JupyterLab in Debian Chromium.

A run is registered in a temporary registry (``TORCHLENS_RUNS_DIR``, which
the server inherits) with this test's own pid, so the server sees it alive;
its live.json is written from a real ``RunView`` (tests/ranks/live_doc.py).
One rank's host name is markup, to check that file content is shown as text.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_harness import Lab, start_lab, stop_lab

# tests/ is on sys.path (pytest puts tests/conftest.py's folder there)
from ranks.live_doc import four_rank_view, live_document, write_live

from torchlens.frontends.ranks import registry as reg

pytestmark = pytest.mark.slow

PANEL = "#torchlens-gpu-monitor"
TAB = '.lm-TabBar-tab[data-id="torchlens-gpu-monitor"]'
RUNS = f"{PANEL} .tl-runs"
RUN_ID = "8c1f0e27a4b9d3e1"
MARKUP_HOST = '<img src=x onerror="window.__tl_injected=1">gpu-b'


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
    server = start_lab(tmp_path_factory.mktemp("lab"), "/user/alice/")
    try:
        yield server
    finally:
        stop_lab(server)


def open_panel(page: Any) -> None:
    """Click the sidebar tab until the jobs section has answered once (the layout
    restorer may reopen the panel just after the check, and a click closes it)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.locator(TAB).wait_for(timeout=60_000)
    polled = page.locator(f"{RUNS}[data-polls]")
    for _ in range(3):
        if not page.locator(PANEL).is_visible():
            page.locator(TAB).click()
        try:
            polled.wait_for(timeout=10_000)
            return
        except PlaywrightTimeout:
            continue
    polled.wait_for(timeout=30_000)


def polls(page: Any) -> int:
    return int(page.locator(RUNS).get_attribute("data-polls") or 0)


def test_sidebar_lists_a_runs_ranks(lab: Lab, registry: Path, chromium: Any,
                                    tmp_path: Path) -> None:
    page = chromium.new_page()
    entry = None
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        page.locator(f"{RUNS} .tl-runs-none").wait_for(timeout=30_000)
        assert page.locator(f"{RUNS} .tl-runs-none").inner_text() == (
            "no torchlens run job on this machine")

        run_dir = tmp_path / "exp1"
        run_dir.mkdir()
        command = ["torchrun", "--nnodes", "2", "--nproc-per-node", "2", "train.py",
                   "--note", "two words"]
        entry = reg.register(RUN_ID, str(run_dir), "127.0.0.1:41233", command)
        card = page.locator(f'{RUNS} .tl-run[data-run-id="{RUN_ID}"]')
        card.wait_for(timeout=30_000)
        assert card.get_attribute("data-state") == "starting"
        assert "starting" in card.locator(".tl-run-verdict").inner_text()

        write_live(run_dir, live_document(four_rank_view(host1=MARKUP_HOST), RUN_ID))
        page.wait_for_selector(f'{RUNS} .tl-run[data-state="running"]', timeout=30_000)
        assert card.locator(".tl-run-id").inner_text() == f"run {RUN_ID}"
        assert card.locator(".tl-run-command").inner_text() == (
            "torchrun --nnodes 2 --nproc-per-node 2 train.py --note 'two words'")
        assert card.locator(".tl-run-dir").inner_text() == str(run_dir)
        verdict = card.locator(".tl-run-verdict").inner_text()
        assert verdict.startswith("rank 2 was lost: it stopped sending at step 9 (no goodbye, "
                                  f"and node 1 (host {MARKUP_HOST})'s other ranks went on")

        # grouped by node, a line "node N · host" above each group
        heads = card.locator("tr.tl-run-node-head").all_inner_texts()
        assert heads == ["node 0 \u00b7 gpu-a", f"node 1 \u00b7 {MARKUP_HOST}"]
        rows = card.locator("tr.tl-run-rank")
        assert rows.count() == 4
        cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(4)]
        assert [c[0] for c in cells] == ["0", "1", "2", "3"]
        assert [c[1] for c in cells] == ["running", "running", "lost", "failed"]
        assert [c[2] for c in cells] == ["12"] * 4
        assert cells[0][3] == "50.0" and cells[1][4] == "0.4"
        assert cells[0][5] == "3.00 GiB" and cells[1][5] == "101 MiB rss"
        state = card.locator("td.tl-run-state")
        assert state.nth(0).get_attribute("class").split()[-1] == "tl-state-ok"
        assert state.nth(2).get_attribute("class").split()[-1] == "tl-state-bad"
        assert state.nth(3).get_attribute("title") == "failed: RuntimeError: boom"
        # the file's markup stayed text: no element made from it, no script run
        assert page.locator(f"{RUNS} img").count() == 0
        assert page.evaluate("() => window.__tl_injected") is None

        # polled only while the panel is shown
        page.locator(TAB).click()
        page.locator(PANEL).wait_for(state="hidden", timeout=10_000)
        page.wait_for_timeout(2500)  # let a request already under way land
        hidden_at = polls(page)
        page.wait_for_timeout(5000)
        assert polls(page) == hidden_at
        page.locator(TAB).click()
        page.wait_for_function(
            f"() => Number(document.querySelector('{RUNS}').dataset.polls) > {hidden_at}",
            timeout=30_000)

        # the run ends: it stays listed as ended, with how to see its report
        write_live(run_dir, live_document(four_rank_view(MARKUP_HOST, ended=True), RUN_ID,
                                          ended=True))
        reg.unregister(entry)
        page.wait_for_selector(f'{RUNS} .tl-run[data-state="ended"]', timeout=30_000)
        assert card.locator(".tl-run-hint").inner_text() == f"torchlens report {run_dir}"
        states = card.locator("td.tl-run-state").all_inner_texts()
        assert states == ["finished", "finished", "lost", "failed"]
    finally:
        reg.unregister(entry)
        page.close()


def test_runs_endpoint_refuses_without_token(lab: Lab) -> None:
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{lab.url}torchlens/runs", timeout=10)
    assert err.value.code == 403
