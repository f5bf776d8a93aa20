"""The live view of ``%ddp_check --profile`` (and the report
left in its place) loads without BokehJS warnings. Its panels start with no
rows, and BokehJS logged "could not set initial ranges" for each empty figure
on every layout pass (27 times when the view opened). Once rows arrive, each
panel's axes cover its rows and nothing else (no placeholder left; the step
time axis starts at 0 as every duration's does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bokeh.embed import file_html
from bokeh.resources import INLINE

from torchlens.frontends.kinds import report_html
from torchlens.frontends.shared.live_view import ProfiledLiveView
from torchlens.model import load_profile
from torchlens.model.messages import DdpHeartbeat
from torchlens.render.ddp.heartbeats import rank_figures

V1 = Path(__file__).resolve().parents[1] / "data" / "v1"

# Stream rows (steps 5..7, values 100..120) into every empty source of the
# panels drawn by step, as the kernel's first flushes do.
STREAM_JS = """() => {
  const doc = Object.values(Bokeh.index)[0].model.document;
  let n = 0;
  for (const m of doc._all_models.values()) {
    if (m.type !== 'ColumnDataSource' || m.get_length() !== 0 || !('step' in m.data) || 'xs' in m.data) continue;
    const cols = {};
    for (const k of Object.keys(m.data)) cols[k] = k === 'step' ? [5, 6, 7] : [100, 120, 110];
    m.stream(cols); n++;
  }
  return n;
}"""
STEP_Y_JS = """() => {
  const views = [];
  const walk = (v) => { views.push(v); for (const c of (v.child_views || [])) walk(c); };
  for (const v of Object.values(window.Bokeh.index)) walk(v);
  const p = views.find((v) => v.model.title && String(v.model.title.text).startsWith('Step time'));
  return [p.model.y_range.start, p.model.y_range.end, p.model.x_range.start, p.model.x_range.end];
}"""


def _open(chromium: Any, path: Path) -> tuple[Any, list[str]]:
    page = chromium.new_page()
    messages: list[str] = []
    page.on("console", lambda m: messages.append(f"{m.type}: {m.text}")
            if m.type in ("warning", "error") else None)
    page.on("response", lambda r: messages.append(f"HTTP {r.status} {r.url}")
            if r.status >= 400 else None)
    page.goto(path.as_uri())
    page.wait_for_function("() => window.Bokeh && Object.keys(window.Bokeh.index).length > 0")
    page.wait_for_timeout(800)
    return page, messages


def test_live_view_opens_without_warnings_and_fits_its_first_rows(chromium: Any,
                                                                    tmp_path: Path) -> None:
    view = ProfiledLiveView(2, 10, modelled=True)
    assert view.widget is not None  # what the notebook is sent: the view as it opens, before any row
    path = tmp_path / "live.html"
    path.write_text(file_html(view.layout, INLINE, "live view"), encoding="utf-8")
    page, messages = _open(chromium, path)
    try:
        assert messages == [], messages
        assert page.evaluate(STREAM_JS) >= 2
        page.wait_for_timeout(500)
        y0, y1, x0, x1 = page.evaluate(STEP_Y_JS)
    finally:
        page.close()
    assert messages == [], messages
    # a duration's axis starts at 0; its top is the rows' (no placeholder left)
    assert y0 == 0 and 120 < y1 <= 126, (y0, y1)
    assert 4.5 <= x0 < 5 and 7 < x1 <= 7.5, (x0, x1)


def test_ddp_check_report_loads_without_warnings(chromium: Any, tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    path.write_text(report_html(load_profile(V1 / "ddp_check.tlprof")), encoding="utf-8")
    page, messages = _open(chromium, path)
    page.close()
    assert messages == [], messages


def test_heartbeats_without_collective_counts_load_without_warnings(chromium: Any,
                                                                   tmp_path: Path) -> None:
    """--profile's report: its heartbeats count no collectives, so that panel is
    hidden, and a hidden plot with no span made BokehJS warn."""
    beats = [DdpHeartbeat(t_rel=0.5 * i, rank=r, phase="step", rss=(300 + i) * 2**20)
             for i in range(10) for r in (0, 1)]
    path = tmp_path / "beats.html"
    path.write_text(file_html(rank_figures(beats, 2), INLINE, "heartbeats"), encoding="utf-8")
    page, messages = _open(chromium, path)
    page.close()
    assert messages == [], messages
