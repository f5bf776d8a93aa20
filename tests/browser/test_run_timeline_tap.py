"""The run report's joint timeline in Chromium: a collective tapped
on one rank is selected on every rank, in the saved file, without a server.

The run is four copies of the shared A100 DDP trace with their clocks moved
(as ``benchmarks/make_rank_set.py`` does), so every collective exists on every
rank.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from torchlens.frontends.cli.main import main

SHOTS = Path(os.environ.get("TORCHLENS_SCREENSHOTS", "/tmp"))
SHIFTS = [0.0, 3000.0, -1500.0, 800.0]

#: zoom onto rank 0's widest collective bar and return where to click it
FIND_JS = """
() => {
  const doc = Bokeh.documents[0];
  const src = doc.get_model_by_name('run-timeline-events');
  const fig = doc.get_model_by_name('run-timeline');
  const d = src.data;
  let best = -1;
  for (let i = 0; i < d.key.length; i++)
    if (d.key[i] && d.rank[i] === 0 && d.lane[i] === 'collectives' &&
        (best < 0 || d.right[i] - d.left[i] > d.right[best] - d.left[best])) best = i;
  const w = d.right[best] - d.left[best];
  fig.x_range.start = d.left[best] - 2 * w;
  fig.x_range.end = d.right[best] + 2 * w;
  return {index: best, key: d.key[best], n: d.key.length};
}
"""
WHERE_JS = """
(index) => {
  const doc = Bokeh.documents[0];
  const src = doc.get_model_by_name('run-timeline-events');
  const fig = doc.get_model_by_name('run-timeline');
  const pv = Bokeh.index.find_one(fig);
  const d = src.data;
  const x = pv.frame.x_scale.compute((d.left[index] + d.right[index]) / 2);
  const y = pv.frame.y_scale.compute(d.y[index]);
  const box = pv.canvas_view.el.getBoundingClientRect();
  return {x: box.left + x, y: box.top + y};
}
"""
SELECTED_JS = """
() => {
  const src = Bokeh.documents[0].get_model_by_name('run-timeline-events');
  return src.selected.indices.map(i => [src.data.key[i], src.data.rank[i], src.data.lane[i]]);
}
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory, traces_dir) -> Path:
    import gzip

    with gzip.open(traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz") as f:
        doc = json.load(f)
    tmp = tmp_path_factory.mktemp("run-timeline")
    folder = tmp / "run"
    folder.mkdir()
    for rank, shift in enumerate(SHIFTS):
        copy = {**doc, "distributedInfo": {**doc.get("distributedInfo", {}), "rank": rank,
                                           "world_size": len(SHIFTS)},
                "traceEvents": [{**e, "ts": e["ts"] + shift} if "ts" in e else e
                                for e in doc["traceEvents"]]}
        (folder / f"rank{rank}.json").write_text(json.dumps(copy))
    out = tmp / "run.html"
    assert main(["report", str(folder), "-o", str(out)]) == 0
    return out


def test_a_tapped_collective_is_selected_on_every_rank(chromium, report) -> None:
    page = chromium.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(report.as_uri())
    page.wait_for_function("window.Bokeh && Bokeh.documents.length > 0 && "
                           "Bokeh.documents[0].get_model_by_name('run-timeline')",
                           timeout=30_000)
    page.locator("#timeline").scroll_into_view_if_needed()
    picked = page.evaluate(FIND_JS)
    assert picked["index"] >= 0 and picked["key"]
    page.wait_for_timeout(500)  # the zoomed frame is drawn
    at = page.evaluate(WHERE_JS, picked["index"])
    page.mouse.click(at["x"], at["y"])
    page.wait_for_timeout(300)
    selected = page.evaluate(SELECTED_JS)
    # the same collective, and only it, on every rank: its host bar and its NCCL kernel
    assert {key for key, _, _ in selected} == {picked["key"]}
    assert {rank for _, rank, _ in selected} == set(range(len(SHIFTS)))
    assert {lane for _, _, lane in selected if lane != "collectives"}, "its kernels too"
    page.locator("#timeline").screenshot(path=str(SHOTS / "run_timeline_tap.png"))
    assert errors == []
    page.close()
