"""Debian Chromium (driven by Playwright) for the sidebar tests; JupyterLab comes from lab_harness."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_harness import CHROMIUM, CHROMIUM_FLAGS


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Debian Chromium (fresh profile) per test module.

    Not per session: Playwright's sync API keeps an event loop running while
    it is open, which breaks every later asyncio test (tests/server).
    """
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"{CHROMIUM} is absent: run scripts/setup-browser (apt-get install chromium)"
        )
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright missing: run scripts/setup-browser"
    )
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()
