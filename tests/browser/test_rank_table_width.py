"""The per-rank table of a ``%ddp_check --profile`` report
(steps, phase times and memory per rank) fits a notebook beside the open
sidebar: as one table of 17 columns it sat in a scroll box of its own, 1310 px
wide in 758, so the reader scrolled inside the page as well as the page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchlens.render.ddp.report import rank_table_html
from torchlens.render.html import source

ROW = {"rank": 0, "steps": 20, "step_ms": 23.4, "other_ms": 0.25, "data_ms": 0.18,
       "forward_ms": 0.23, "backward_ms": 22.3, "optimizer_ms": 0.11, "collective_ms": 0.0,
       "allocated": 11264, "reserved": 2097152, "frag": 0.9946, "largest_free": 2081792,
       "peak_allocated": 13312, "peak_reserved": 2097152, "rss": 333217792,
       "peak_rss": 333217792, "source": "modelled"}

OVERFLOWING = """() => [...document.querySelectorAll('.tl-table')]
  .filter((e) => e.scrollWidth > e.clientWidth + 1).map((e) => [e.scrollWidth, e.clientWidth])"""


@pytest.mark.parametrize("width", [640, 800, 1000])
def test_rank_table_has_no_scroll_box_of_its_own(chromium: Any, tmp_path: Path, width: int) -> None:
    rows = [ROW, {**ROW, "rank": 1, "data_ms": 21.2, "step_ms": 26.1}]
    path = tmp_path / "t.html"
    path.write_text(f"<!doctype html><style>{source('report.css')}</style>{rank_table_html(rows)}",
                    encoding="utf-8")
    page = chromium.new_page()
    page.set_viewport_size({"width": width, "height": 800})
    try:
        page.goto(path.as_uri())
        wide = page.evaluate(OVERFLOWING)
        text = page.inner_text("body")
    finally:
        page.close()
    assert wide == [], f"{width} px: tables scroll inside the page ({wide})"
    for word in ("backward", "peak rss", "modelled"):  # every column is still there
        assert word in text
