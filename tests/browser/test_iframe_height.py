"""A report in a notebook is as tall as its content, so the
notebook's own scroll reads it: in a fixed 720 px frame it scrolled inside the
page as well (the reader scrolled twice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchlens.frontends import kinds
from torchlens.model import load_profile

V1 = Path(__file__).resolve().parents[1] / "data" / "v1"


@pytest.mark.parametrize("kind", ["torchprof", "ddp_check"])
def test_report_frame_fits_its_report(kind: str, chromium: Any, tmp_path: Path) -> None:
    bundle = kinds.display_bundle(load_profile(V1 / f"{kind}.tlprof"))["text/html"]
    page_file = tmp_path / "page.html"
    page_file.write_text(f"<!DOCTYPE html><html><body>{bundle}</body></html>")
    page = chromium.new_page()
    page.set_viewport_size({"width": 800, "height": 700})
    try:
        page.goto(page_file.as_uri())
        frame = page.frames[1]
        frame.wait_for_selector(".bk-Canvas canvas", timeout=20_000)
        page.wait_for_timeout(1000)
        inner = frame.evaluate("[document.documentElement.scrollHeight,"
                               " document.documentElement.clientHeight]")
        outer = page.evaluate("document.querySelector('iframe').getBoundingClientRect().height")
    finally:
        page.close()
    assert inner[0] > 720, inner  # a report longer than the old frame
    assert inner[0] <= inner[1], f"{kind}: the report scrolls inside its frame {inner}"
    assert outer >= inner[0], (outer, inner)
