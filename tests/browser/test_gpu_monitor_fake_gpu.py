"""The per-GPU card in a real browser, over fake GPUs: NVLink rate / n/a, kernel tag,
what NVML did not read, the PCIe reading's age, the driver's reserved memory and
why a GPU has no CUDA ordinal.

The server loads ``fake_gpu_ext`` (NVML fake, see there) before torchlens;
everything after the sampler - monitor, socket, sidebar - is the real thing.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_harness import Lab, start_lab, stop_lab
from test_gpu_monitor_sidebar import PANEL, open_panel

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp: Path = tmp_path_factory.mktemp("lab-fake-gpu")
    enable = tmp / "config" / "jupyter_server_config.d"
    enable.mkdir(parents=True)
    (enable / "fake_gpu_ext.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"fake_gpu_ext": True}}})
    )
    path = os.pathsep.join(
        [str(HERE), str(HERE.parent / "server"), os.environ.get("PYTHONPATH", "")]
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", path.rstrip(os.pathsep))
        server = start_lab(tmp)
    try:
        yield server
    finally:
        stop_lab(server)


def start_kernel(lab: Lab) -> str:
    request = urllib.request.Request(
        f"{lab.url}api/kernels",
        data=b"{}",
        method="POST",
        headers={
            "Authorization": f"token {lab.token}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["id"]


def test_card_shows_nvlink_rate_na_and_kernel_tag(
    lab: Lab, chromium: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    shots = tmp_path_factory.mktemp("screenshots")  # kept by pytest for a look after a run
    kernel = start_kernel(lab)
    page = chromium.new_page()
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=60_000)
        open_panel(page)
        cards = page.locator(f"{PANEL} .tl-gpu")
        page.wait_for_function(
            f"() => document.querySelectorAll('{PANEL} .tl-gpu').length === 2",
            timeout=30_000,
        )
        # 50 MiB per 0.5 s sample on GPU 0: a rate in MB/s, never n/a after the first sample
        nvlink0 = cards.nth(0).locator("tr", has_text="NVLink")
        page.wait_for_function(
            "el => /^NVLinktx \\d+ MB\\/s · rx \\d+ MB\\/s$/.test(el.textContent)",
            arg=nvlink0.element_handle(),
            timeout=30_000,
        )
        assert (
            cards.nth(0).locator("tr", has_text="PCIe").inner_text().count("MB/s") == 2
        )
        assert cards.nth(1).locator("tr", has_text="NVLink").inner_text().split() == [
            "NVLink", "tx", "n/a", "·", "rx", "n/a",
        ]  # fmt: skip
        # what NVML would not read is said per GPU, as plain text, not as an error
        not_read = cards.nth(1).locator(".tl-not-read")
        assert not_read.inner_text() == (
            "not read: NVLink tx (field 138: NVML_ERROR_NOT_SUPPORTED; field 202: "
            "NVML_ERROR_NOT_SUPPORTED); NVLink rx (field 139: NVML_ERROR_NOT_SUPPORTED; "
            "field 204: NVML_ERROR_NOT_SUPPORTED)"
        )
        assert cards.nth(0).locator(".tl-not-read").count() == 0  # GPU 0 read everything
        assert page.locator(f"{PANEL} .tl-error").count() == 0
        # PCIe is read every 5 s: the row says how old its figures are
        assert re.search(r"\(read \d+ s ago\)$", cards.nth(0).locator("tr", has_text="PCIe").inner_text())
        memory = cards.nth(0).locator("tr", has_text="memory").inner_text()
        assert memory.endswith("10.0 GiB / 40.0 GiB (+ 600.0 MiB reserved by the driver)")
        # two GPU models under CUDA's default FASTEST_FIRST: no cuda:k, and why
        for k in (0, 1):
            assert "(cuda:" not in cards.nth(k).locator(".tl-gpu-title").inner_text()
            assert cards.nth(k).locator(".tl-cuda-note").inner_text().startswith(
                "no CUDA ordinal: CUDA_DEVICE_ORDER is FASTEST_FIRST")
        page.locator(f"{PANEL} .tl-gpus").screenshot(path=str(shots / "gpu-cards.png"))
        # the kernel started above holds memory on GPU 0: tagged with its id
        tag = cards.nth(0).locator(f"li[data-kernel='{kernel}'] .tl-kernel")
        tag.wait_for(timeout=30_000)
        assert tag.inner_text().strip() == f"[kernel {kernel[:8]}]"
        csv_head = page.evaluate(
            "async url => (await (await fetch(url)).text()).split('\\n')[0]",
            f"{lab.url}torchlens/monitor/history.csv?token={lab.token}",
        )
        assert "gpu0_nvlink_tx_bps" in csv_head and "gpu1_nvlink_rx_bps" in csv_head
    finally:
        page.close()
