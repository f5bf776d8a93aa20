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
from ranks.live_doc import four_rank_view, live_document, slow_rank_view, write_live

from torchlens.analysis.ranks.verdict import RankStatus
from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest, write_manifest
from torchlens.frontends.ranks import registry as reg
from torchlens.render.ranks.terminal import memory_cell

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("TORCHLENS_SCREENSHOTS", "/tmp"))

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
        # the memory column as the terminal writes it: CUDA allocated, else RSS
        rows_doc = live_document(four_rank_view(host1=MARKUP_HOST), RUN_ID)["ranks"]
        assert [c[5] for c in cells[:2]] == [memory_cell(RankStatus(**r)) for r in rows_doc[:2]]
        assert cells[0][5] == "3.0 GiB" and cells[1][5] == "101.0 MiB rss"
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


KiB, MiB = 1024, 1024**2


def _memory_texts(card: Any) -> tuple[str, list[str]]:
    """The memory column's header and each rank row's memory cell, as shown."""
    header = card.locator("table.tl-run-ranks th").last.inner_text()
    cells = card.locator("tr.tl-run-rank td.tl-run-mem").all_inner_texts()
    return header, [" ".join(c.split()) for c in cells]


def test_memory_column_follows_the_terminals_rule(lab: Lab, registry: Path, chromium: Any,
                                                 tmp_path: Path) -> None:
    """The walk's FSDP2 CPU job: the sidebar showed the modelled in-step figure
    ("~47.5 KiB") where ``torchlens run``'s terminal showed "320.0 MiB rss". Both
    now show what the terminal's ``memory_cell`` gives for the same live.json row:
    CUDA allocated when measured, else the RSS, ``~`` only with nothing measured."""
    cpu_dir, mixed_dir = tmp_path / "fsdp2-cpu", tmp_path / "mixed"
    cpu_dir.mkdir()
    mixed_dir.mkdir()
    cpu_id, mixed_id = "5a5a5a5a5a5a5a5a", "6b6b6b6b6b6b6b6b"
    cpu = live_document(four_rank_view(), cpu_id)
    cpu["ranks"] = cpu["ranks"][:2]
    for row, allocated in zip(cpu["ranks"], (int(47.5 * KiB), 4 * KiB), strict=True):
        # the second walk's widths: four-digit steps and milliseconds beside "356.0 MiB"
        row.update(allocated=allocated, reserved=2 * MiB, rss=356 * MiB, source="modelled",
                   steps=1234, step_ms=1362.6, data_ms=1245.8)
    mixed = live_document(four_rank_view(), mixed_id)
    # rank 0: CUDA (3 GiB allocated); 1: modelled and RSS; 2: modelled alone; 3: RSS alone
    mixed["ranks"][1].update(allocated=int(47.5 * KiB), rss=330 * MiB, source="modelled")
    mixed["ranks"][2].update(allocated=4 * KiB, rss=None, source="modelled")
    mixed["ranks"][3].update(allocated=None, reserved=None, rss=101 * MiB, source="rss")
    write_live(cpu_dir, cpu)
    write_live(mixed_dir, mixed)
    entries = [reg.register(cpu_id, str(cpu_dir), "127.0.0.1:41234", ["torchrun", "fsdp2.py"]),
               reg.register(mixed_id, str(mixed_dir), "127.0.0.1:41235", ["torchrun", "mix.py"])]
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        for run_id in (cpu_id, mixed_id):
            page.locator(f'{RUNS} .tl-run[data-run-id="{run_id}"] tr.tl-run-rank').first.wait_for(
                timeout=30_000)
        page.wait_for_timeout(500)
        page.locator(f'{RUNS} .tl-run[data-run-id="{cpu_id}"]').screenshot(
            path=str(tmp_path / "runs-memory-cpu.png"))

        # every rank measured its RSS: the header names it once, each cell the figure
        header, cells = _memory_texts(page.locator(f'{RUNS} .tl-run[data-run-id="{cpu_id}"]'))
        assert header == "rss"
        assert [f"{c} {header}" for c in cells] == [memory_cell(RankStatus(**r))
                                                    for r in cpu["ranks"]]
        assert not any("~" in c for c in cells) and "KiB" not in " ".join(cells)
        # the terminal's one-decimal figure still fits the sidebar's default width (its
        # unit may go under it)
        fits = page.locator(f'{RUNS} .tl-run[data-run-id="{cpu_id}"] .tl-run-table').evaluate(
            "box => box.scrollWidth <= box.clientWidth")
        assert fits

        header, cells = _memory_texts(page.locator(f'{RUNS} .tl-run[data-run-id="{mixed_id}"]'))
        assert header == "memory"
        assert cells == [memory_cell(RankStatus(**r)) for r in mixed["ranks"]]
        # CUDA: allocated; modelled with RSS: the RSS; modelled alone: "~"; RSS alone
        assert cells == ["3.0 GiB", "330.0 MiB rss", "~4.0 KiB", "101.0 MiB rss"], cells
    finally:
        for entry in entries:
            reg.unregister(entry)
        page.close()


def test_the_slow_rank_row_is_marked_by_the_verdicts_code_and_ranks(
        lab: Lab, registry: Path, chromium: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "slow"
    run_dir.mkdir()
    run_id = "7c7c7c7c7c7c7c7c"
    doc = live_document(slow_rank_view(), run_id)
    assert doc["verdict_code"] == "slow_rank" and doc["verdict_ranks"] == [1]
    write_live(run_dir, doc)
    entry = reg.register(run_id, str(run_dir), "127.0.0.1:41236",
                         ["torchrun", "--nproc-per-node", "4", "train.py"])
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        card = page.locator(f'{RUNS} .tl-run[data-run-id="{run_id}"]')
        card.locator("tr.tl-run-rank").first.wait_for(timeout=30_000)
        page.wait_for_timeout(500)
        card.screenshot(path=str(SHOTS / "runs-slow-rank.png"))
        rows = card.locator("tr.tl-run-rank")
        assert [rows.nth(i).get_attribute("data-mark") for i in range(4)] == [
            None, "slow_rank", None, None]
        mark = rows.nth(1).locator(".tl-run-mark")
        assert mark.inner_text() == "slow"
        # the verdict's own line on hover: the marker and the rank number say it
        assert mark.get_attribute("title") == doc["verdict"]
        assert rows.nth(1).locator("td").first.get_attribute("title") == (
            f"rank 1: {doc['verdict']}")
        assert card.locator(".tl-run-mark").count() == 1
        # still the sidebar's default width: the marker goes under the rank number
        assert card.locator(".tl-run-table").evaluate("b => b.scrollWidth <= b.clientWidth")

        # the marker follows the code and ranks, never the words: the same line
        # with another code marks nothing, and ranks [2] mark rank 2
        doc2 = {**doc, "verdict_code": "note", "t": doc["t"] + 1}
        write_live(run_dir, doc2)
        page.wait_for_function(
            f"() => !document.querySelector('{RUNS} .tl-run[data-run-id=\"{run_id}\"] "
            ".tl-run-mark')", timeout=30_000)
        write_live(run_dir, {**doc, "verdict_ranks": [2], "t": doc["t"] + 2})
        card.locator('tr.tl-run-rank[data-rank="2"] .tl-run-mark').wait_for(timeout=30_000)
        assert card.locator(".tl-run-mark").count() == 1
    finally:
        reg.unregister(entry)
        page.close()


def test_a_job_shorter_than_the_poll_shows_once_it_ended(
        lab: Lab, registry: Path, chromium: Any, tmp_path: Path) -> None:
    """A 5 s job between two polls: registered, run and ended while the panel
    is hidden (no poll sees it running); the next poll lists it as ended, with
    its verdict, the slow rank marked, how it stopped and when."""
    page = chromium.new_page()
    entry = None
    run_id = "9d9d9d9d9d9d9d9d"
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        page.locator(TAB).click()  # hidden: the section does not poll
        page.locator(PANEL).wait_for(state="hidden", timeout=10_000)
        page.wait_for_timeout(2500)
        hidden_at = polls(page)

        run_dir = tmp_path / "short"
        run_dir.mkdir()
        entry = reg.register(run_id, str(run_dir), "127.0.0.1:41237",
                             ["torchrun", "--nproc-per-node", "4", "short.py"])
        write_live(run_dir, live_document(slow_rank_view(), run_id))
        write_live(run_dir, live_document(slow_rank_view(ended=True), run_id, ended=True))
        write_manifest(str(run_dir), Manifest(source=SOURCE_RUN, world_size=4, run_id=run_id,
                                              stopped="all 4 ranks finished"))
        reg.finish(entry)
        assert polls(page) == hidden_at  # nothing saw it running

        page.locator(TAB).click()
        card = page.locator(f'{RUNS} .tl-run[data-run-id="{run_id}"]')
        card.wait_for(timeout=30_000)
        assert card.get_attribute("data-state") == "ended"
        assert card.locator(".tl-run-verdict").inner_text().startswith(
            "rank 1 is the slow rank")
        assert card.locator('tr.tl-run-rank[data-rank="1"] .tl-run-mark').inner_text() == "slow"
        assert card.locator("td.tl-run-state").all_inner_texts() == ["finished"] * 4
        stopped = card.locator(".tl-run-stopped").inner_text()
        assert stopped.startswith("all 4 ranks finished \u00b7 ended ") and stopped.endswith(
            " s ago"), stopped
        assert card.locator(".tl-run-hint").inner_text() == f"torchlens report {run_dir}"
        page.wait_for_timeout(300)
        card.screenshot(path=str(SHOTS / "runs-short-job-ended.png"))
    finally:
        reg.unregister(entry)
        page.close()
