"""Every shared trace's report fits a 1280 px wide window (long CUDA
kernel names made the A100 DDP report about 13,700 px wide)."""

from __future__ import annotations

import pytest

from torchlens.formats.kineto import load_trace
from torchlens.frontends.kinds import report_html
from torchlens.model import Profile

TRACES = ["a100_ddp_resnet_rank0_nccl.json.gz", "a100_simple_add.json.gz",
          "amd_mi250_rocm.json.gz", "cpu_only_gloo_rank34.json.gz",
          "no_distributed_info.json.gz", "sampled_rank-0.json.gz",
          "sampled_rank-1.json.gz", "triton_compile.json.gz",
          "v100_ddp_sgd_annotations_rank0.json.gz"]
VIEWPORT = 1280


@pytest.fixture(scope="module")
def page(chromium):
    page = chromium.new_page()
    page.set_viewport_size({"width": VIEWPORT, "height": 900})
    yield page
    page.close()


@pytest.mark.parametrize("name", TRACES)
def test_report_fits_the_window(page, traces_dir, tmp_path, name) -> None:
    path = tmp_path / "report.html"
    path.write_text(report_html(Profile(kind="trace", title=name, created_at=0.0,
                                        traces={"main": load_trace(traces_dir / name)})),
                    encoding="utf-8")
    page.goto(path.as_uri())
    page.wait_for_function("document.querySelectorAll('.bk-Figure, .bk-Column').length > 0"
                           " || !document.querySelector('[data-root-id]')", timeout=30_000)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= VIEWPORT, f"{name}: the page is {width} px wide"
    # a shortened name keeps its full text on hover
    for cell in page.query_selector_all("td[title]"):
        assert len(cell.get_attribute("title")) >= len(cell.inner_text().rstrip("…"))
