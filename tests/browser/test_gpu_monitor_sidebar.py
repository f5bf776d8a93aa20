"""The GPU Monitor sidebar in a real JupyterLab in Debian Chromium.

Checks what a user sees on a machine without a GPU: the panel opens, the host
metrics update live, the "no NVIDIA GPU found (...)" line, history kept across
a page reload (it lives in the server), and that the endpoints refuse requests
without the token - at the server root and behind a JupyterHub-style base_url.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_harness import Lab, start_lab, stop_lab

pytestmark = pytest.mark.slow

PANEL = "#torchlens-gpu-monitor"
TAB = '.lm-TabBar-tab[data-id="torchlens-gpu-monitor"]'


@pytest.fixture(scope="module", params=["/", "/user/alice/"], ids=["root", "base_url"])
def lab(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Lab]:
    tmp: Path = tmp_path_factory.mktemp("lab")
    server = start_lab(tmp, request.param)
    try:
        yield server
    finally:
        stop_lab(server)


def samples_shown(page: Any) -> int:
    value = page.locator(f"{PANEL} .tl-footer").get_attribute("data-samples")
    return int(value or 0)


def open_panel(page: Any) -> None:
    """Click the sidebar tab unless the layout restorer already reopened the panel."""
    page.locator(TAB).wait_for(timeout=60_000)
    if not page.locator(PANEL).is_visible():
        page.locator(TAB).click()
    page.locator(f"{PANEL} .tl-footer[data-samples]").wait_for(timeout=30_000)


def test_endpoints_refuse_without_token(lab: Lab) -> None:
    for path in ("samples", "config", "history.csv"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{lab.url}torchlens/monitor/{path}", timeout=10)
        assert err.value.code == 403
    request = urllib.request.Request(
        f"{lab.url}torchlens/monitor/ranks",
        data=b'{"run":"x","samples":[]}',
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    assert err.value.code == 403


def test_sidebar_live_no_gpu_and_history_survives_reload(
    lab: Lab, chromium: Any
) -> None:
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        status = page.locator(f"{PANEL} .tl-status")
        page.wait_for_function(
            "el => el.textContent.startsWith('no NVIDIA GPU found (')",
            arg=status.element_handle(),
            timeout=30_000,
        )
        assert "n/a" not in status.inner_text()

        # host metrics update live, at least twice
        first = samples_shown(page)
        cpu = page.locator(f"{PANEL} .tl-host-cpu")
        assert cpu.inner_text().startswith("CPU ")
        for step in (1, 2):
            page.wait_for_function(
                f"() => Number(document.querySelector('{PANEL} .tl-footer').dataset.samples) >= {first + step}",
                timeout=30_000,
            )
        assert page.locator(f"{PANEL} .tl-host-ram").inner_text().startswith("RAM ")
        assert page.locator(f"{PANEL} .tl-chart canvas").count() >= 1
        before_reload = samples_shown(page)

        # history lives in the server: a reload shows at least as many samples at once
        page.reload(timeout=60_000)
        open_panel(page)
        assert samples_shown(page) >= before_reload
        latency = page.locator(PANEL).get_attribute("data-latency-ms")
        assert latency is not None
    finally:
        page.close()


def test_pause_stops_updates_and_export_downloads_csv(lab: Lab, chromium: Any) -> None:
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        page.locator(f"{PANEL} .tl-pause").click()
        page.wait_for_timeout(300)  # let a reply already being drawn finish
        paused_at = samples_shown(page)
        page.wait_for_timeout(2500)
        assert samples_shown(page) == paused_at
        page.locator(f"{PANEL} .tl-pause").click()
        page.wait_for_function(
            f"() => Number(document.querySelector('{PANEL} .tl-footer').dataset.samples) > {paused_at}",
            timeout=30_000,
        )
        with page.expect_download() as info:
            page.locator(f"{PANEL} .tl-export").click()
        text = Path(info.value.path()).read_text()
        assert text.startswith("time,host_cpu_percent") and len(text.splitlines()) > 2
    finally:
        page.close()
