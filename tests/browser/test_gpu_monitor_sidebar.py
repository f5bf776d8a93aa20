"""The GPU Monitor sidebar in a real JupyterLab in Debian Chromium.

Checks what a user sees on a machine without a GPU: the panel opens, the host
metrics update live, the "no NVIDIA GPU found (...)" line, history kept across
a page reload (it lives in the server), that the samples arrive over the
monitor's WebSocket (and over long polling when the socket is unreachable),
and that the endpoints and the socket refuse requests without the token - at
the server root and behind a JupyterHub-style base_url.
"""

from __future__ import annotations

import base64
import http.client
import os
import urllib.error
import urllib.parse
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
    """Click the sidebar tab unless the layout restorer already reopened the panel.

    Retried: the restorer can reopen the panel just after the visibility
    check, and the click then closes it again.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.locator(TAB).wait_for(timeout=60_000)
    footer = page.locator(f"{PANEL} .tl-footer[data-samples]")
    for _ in range(3):
        if not page.locator(PANEL).is_visible():
            page.locator(TAB).click()
        try:
            footer.wait_for(timeout=10_000)
            return
        except PlaywrightTimeout:
            continue
    footer.wait_for(timeout=30_000)


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


def websocket_handshake_status(lab: Lab, token: str | None) -> int:
    """Status of a raw WebSocket upgrade to the monitor's socket (101 = accepted)."""
    url = urllib.parse.urlsplit(f"{lab.url}torchlens/monitor/ws")
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    headers = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
        "Sec-WebSocket-Version": "13",
    }
    if token is not None:
        headers["Authorization"] = f"token {token}"
    try:
        conn.request("GET", url.path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_socket_refuses_without_token(lab: Lab) -> None:
    assert websocket_handshake_status(lab, None) == 403
    assert websocket_handshake_status(lab, "wrong") == 403
    assert websocket_handshake_status(lab, lab.token) == 101


def wait_for_transport(page: Any, transport: str) -> None:
    page.wait_for_function(
        f"() => document.querySelector('{PANEL}').dataset.transport === '{transport}'",
        timeout=30_000,
    )


def test_sidebar_live_no_gpu_and_history_survives_reload(
    lab: Lab, chromium: Any
) -> None:
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        wait_for_transport(page, "websocket")
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
        wait_for_transport(page, "websocket")
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


# Point the sidebar's socket at a path that does not exist (as behind a proxy
# that drops WebSockets); everything else on the page keeps the real WebSocket.
BREAK_MONITOR_SOCKET = """
(() => {
  const Real = window.WebSocket;
  window.WebSocket = class extends Real {
    constructor(url, protocols) {
      super(String(url).replace('/torchlens/monitor/ws', '/torchlens/monitor/nosocket'), protocols);
    }
  };
})();
"""


def test_falls_back_to_long_polling_without_socket(lab: Lab, chromium: Any) -> None:
    page = chromium.new_page()
    try:
        page.add_init_script(BREAK_MONITOR_SOCKET)
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        wait_for_transport(page, "polling")
        first = samples_shown(page)
        page.wait_for_function(
            f"() => Number(document.querySelector('{PANEL} .tl-footer').dataset.samples) >= {first + 2}",
            timeout=30_000,
        )
        assert page.locator(PANEL).get_attribute("data-transport") == "polling"
    finally:
        page.close()
