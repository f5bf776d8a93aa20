"""The notebook's copy of a report carries BokehJS packed, and still draws.

``kinds.display_bundle`` gzips BokehJS into the iframe (a
notebook with ten results grew by about 15 MB). The check opens each kind's
bundle the way JupyterLab shows it, a sandboxed srcdoc iframe, in Chromium:
the Bokeh canvases appear and the console stays clean.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchlens.frontends import kinds
from torchlens.model import load_profile

V1 = Path(__file__).resolve().parents[1] / "data" / "v1"


@pytest.mark.parametrize("kind", ["torchprof", "gpumem", "ddp_check"])
def test_packed_bundle_draws_in_a_sandboxed_iframe(kind: str, chromium: Any, tmp_path) -> None:
    profile = load_profile(V1 / f"{kind}.tlprof")
    bundle = kinds.display_bundle(profile)["text/html"]
    plain = kinds.report_html(profile)
    assert len(bundle) < 0.45 * len(plain)  # the notebook grows by less than half a report
    page_file = tmp_path / "page.html"
    page_file.write_text(f"<!DOCTYPE html><html><body>{bundle}</body></html>")
    page = chromium.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(page_file.as_uri())
        frame = page.frames[1]
        frame.wait_for_selector(".bk-Canvas canvas", timeout=20_000)
        assert frame.locator(".bk-Canvas canvas").count() >= 1
        assert frame.evaluate("typeof window.Bokeh") == "object"
    finally:
        page.close()
    assert not errors, errors
