"""Every timeline names its colours, in Chromium.

A trace report, a run report's joint timeline and a ``%ddp_check`` report
(its heartbeat lanes, and with ``--profile`` its lanes of ops) each carry a
legend built from the timeline's colour map: every colour a bar is drawn in
has an entry, named as the hover names the bar's category or kind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from torchlens.formats.kineto import load_trace
from torchlens.frontends.cli.main import main
from torchlens.frontends.kinds import report_html
from torchlens.model import Profile
from torchlens.render.ddp.heartbeats import PHASE_COLORS
from torchlens.render.ranks.lanes import KIND_COLORS

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("TORCHLENS_SCREENSHOTS", "/tmp"))
V1 = Path(__file__).resolve().parents[1] / "data" / "v1"

#: every timeline legend of the page: its entries' labels and swatch colours
LEGENDS_JS = """
() => Bokeh.documents.flatMap(doc => [...doc.all_models]
  .filter(m => m.name === 'timeline-legend')
  .map(legend => legend.items.map(item => {
    const label = item.label && typeof item.label === 'object' ? item.label.value : item.label;
    const renderer = item.renderers[0];
    let fill = renderer.glyph.fill_color;
    if (fill && typeof fill === 'object')  // a value, or a column read at the item's row
      fill = 'value' in fill ? fill.value : renderer.data_source.data[fill.field][item.index ?? 0];
    return [label, fill];
  })))
"""
#: the (category, colour) pairs the bars of a source with those columns are drawn in
DRAWN_JS = """
([catColumn]) => {
  const out = new Set();
  for (const doc of Bokeh.documents) for (const m of doc.all_models) {
    const d = m.data;
    if (!d || !d.color || !d[catColumn]) continue;
    for (let i = 0; i < d.color.length; i++) out.add(d[catColumn][i] + '\\t' + d.color[i]);
  }
  return [...out].map(s => s.split('\\t'));
}
"""


def open_report(chromium: Any, path: Path, shot: str) -> tuple[Any, list[list[list[str]]]]:
    page = chromium.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(path.as_uri())
    # a layout's figures sit in shadow roots: wait for the document, then its drawing
    page.wait_for_function("window.Bokeh && Bokeh.documents.length > 0", timeout=30_000)
    page.wait_for_timeout(1500)
    legends = page.evaluate(LEGENDS_JS)
    assert errors == []
    return page, legends


def check_named(legends: list[list[list[str]]], drawn: list[list[str]]) -> None:
    """Every (category, colour) drawn has a legend entry of that colour naming it."""
    entries = {(label, colour) for legend in legends for label, colour in legend}
    for cat, colour in drawn:
        names = [label for label, c in entries if c.lower() == colour.lower()]
        assert names, f"{cat} ({colour}) has no legend entry: {entries}"
        assert any(cat in label.split(" / ") for label in names) or cat == "merged", (
            cat, names)


@pytest.mark.parametrize("name", ["a100_simple_add.json.gz", "cpu_only_gloo_rank34.json.gz"])
def test_trace_timeline_names_each_colour(chromium, traces_dir, tmp_path, name) -> None:
    path = tmp_path / "report.html"
    path.write_text(report_html(Profile(kind="trace", title=name, created_at=0.0,
                                        traces={"main": load_trace(traces_dir / name)})),
                    encoding="utf-8")
    page, legends = open_report(chromium, path, name)
    try:
        assert len(legends) == 1, legends
        drawn = page.evaluate(DRAWN_JS, ["cat"])
        assert drawn
        check_named(legends, drawn)
        labels = [label for label, _ in legends[0]]
        if name.startswith("a100"):
            assert "kernel" in labels and "cpu_op" in labels, labels
        figure = page.locator(".bk-Figure").first
        figure.scroll_into_view_if_needed()
        figure.screenshot(path=str(SHOTS / f"timeline-legend-{name.split('.')[0]}.png"))
    finally:
        page.close()


def test_run_timeline_names_each_kind_and_the_busy_bars(chromium, traces_dir,
                                                         tmp_path) -> None:
    import gzip

    with gzip.open(traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz") as f:
        doc = json.load(f)
    folder = tmp_path / "run"
    folder.mkdir()
    for rank in (0, 1):
        copy = {**doc, "distributedInfo": {**doc.get("distributedInfo", {}), "rank": rank,
                                           "world_size": 2}}
        (folder / f"rank{rank}.json").write_text(json.dumps(copy))
    out = tmp_path / "run.html"
    assert main(["report", str(folder), "-o", str(out)]) == 0
    page, legends = open_report(chromium, out, "run")
    try:
        assert len(legends) == 1, legends
        check_named(legends, page.evaluate(DRAWN_JS, ["kind"]))
        labels = [label for label, _ in legends[0]]
        assert "communication" in labels and any(lb.startswith("merged") for lb in labels)
        page.locator("#timeline").screenshot(path=str(SHOTS / "timeline-legend-run.png"))
    finally:
        page.close()


def test_ddp_report_timelines_name_each_phase_and_kind(chromium, tmp_path) -> None:
    from torchlens.model.store import load_profile

    out = tmp_path / "ddp.html"
    out.write_text(report_html(load_profile(V1 / "ddp_check.tlprof")), encoding="utf-8")
    page, legends = open_report(chromium, out, "ddp")
    try:
        assert len(legends) == 1, legends
        check_named(legends, page.evaluate(DRAWN_JS, ["phase"]))
        labels = {label for label, _ in legends[0]}
        assert {"step / training", "failed", "init / starting", "other phase"} <= labels, labels
        assert len(labels) == len(set(PHASE_COLORS.values())) + 1
        page.locator("#ranks-plot").screenshot(path=str(SHOTS / "timeline-legend-ddp.png"))
    finally:
        page.close()


@pytest.fixture(scope="module")
def profiled_ddp(tmp_path_factory) -> Path:
    """A real two-rank ``%ddp_check --profile`` report (gloo, a few steps)."""
    import cloudpickle
    from ddp import profiled

    import torchlens

    cloudpickle.register_pickle_by_value(profiled)  # as tests/ddp/conftest.py does

    tmp = tmp_path_factory.mktemp("ddp-profile")
    result = torchlens.ddp_check(profiled.balanced, world_size=2, profile=True, backend="gloo",
                                 profile_every=4, steps=8, live=False, timeout=120,
                                 run_dir=str(tmp / "run"))
    out = tmp / "ddp-profile.html"
    out.write_text(report_html(result.profile), encoding="utf-8")
    return out


def test_profiled_ddp_timeline_names_each_kind(chromium, profiled_ddp) -> None:
    page, legends = open_report(chromium, profiled_ddp, "ddp-profile")
    try:
        kinds = [ls for ls in legends if {label for label, _ in ls} == set(KIND_COLORS)]
        assert len(kinds) == 1, legends
        check_named(kinds, page.evaluate(DRAWN_JS, ["kind"]))
        page.locator("#rank-profile").screenshot(path=str(SHOTS / "timeline-legend-profile.png"))
    finally:
        page.close()
