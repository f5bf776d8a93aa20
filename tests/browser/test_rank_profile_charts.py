"""The ``%ddp_check --profile`` report's charts, read in Chromium.

One 4-rank report whose ranks 1 and 3 stopped at the end of the run, and
whose ranks 0 and 1 carry the set-up window they cut before their first
``torchlens.step()`` (8.5 s at step 0, as a watch or a run folder gets it).
What a user sees, read from the page's Bokeh models after layout:

- every chart's axis ranges cover the data its renderers draw and not much
  more (the ranges the browser computed, against the sources' columns); the
  step chart spans the real steps only, on an axis named "step";
- every label drawn at a data point (a stopped rank's name) lies inside its
  plot's frame;
- the resident set (hundreds of MiB) has an axis that shows its changes, and
  the CPU run's modelled allocator figures are said in one line, not drawn;
- in a 720 px frame (JupyterLab with the sidebar open) the page is no wider
  than the frame, no status word, header or cell word breaks inside, and no
  chart title is longer than its chart.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from torchlens.frontends import kinds
from torchlens.model.payloads import RankProfiling
from torchlens.model.rank_report import RankError
from torchlens.model.records import StepRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ranks.rank_fixtures import T_START, make_run  # noqa: E402
from ranks.test_live_view import ddp_profile  # noqa: E402

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("TORCHLENS_SCREENSHOTS", "/tmp"))
FRAME = 720
SETUP_S = 8.5
#: how much wider than its data a range may be: Bokeh's auto-range pads 10%
PADDING = 0.25

#: per plot: title, axis labels, its ranges after layout, frame and box, and
#: per visible glyph the numbers it draws on each axis (fields of its source;
#: a stack of fields is summed), and per label its box on the screen
PLOTS_JS = """
() => {
  const num = (v) => typeof v === 'number' && isFinite(v);
  const column = (src, spec) => {
    if (!spec || typeof spec !== 'object') return num(spec) ? [spec] : [];
    if (spec.field !== undefined) return [...(src.data[spec.field] || [])].flat(2).filter(num);
    if (spec.expr && spec.expr.fields) {
      const cols = spec.expr.fields.map(f => src.data[f] || []);
      const n = src.get_length() || 0;  // a stack of no fields: the bars' base, 0
      return [...Array(n).keys()].map(i => cols.reduce((s, c) => s + (num(c[i]) ? c[i] : 0), 0));
    }
    return [];
  };
  const XS = ['x', 'x0', 'x1', 'left', 'right', 'xs'], YS = ['y', 'y0', 'y1', 'y2', 'top', 'bottom', 'ys'];
  const range = (r) => r.factors ? {factors: [...r.factors]} : {start: r.start, end: r.end, type: r.type};
  const out = [];
  const seen = new Set();
  const ctx = document.createElement('canvas').getContext('2d');
  const visit = (view) => {
    if (!view || seen.has(view)) return;
    seen.add(view);
    const m = view.model;
    if (m && m.x_range && m.y_range && view.frame) {
      const f = view.frame.bbox;
      const glyphs = [];
      for (const r of m.renderers) {
        if (!r.visible || !r.glyph || !r.data_source || !r.data_source.data) continue;
        const src = r.data_source, g = r.glyph;
        const xs = XS.flatMap(k => k in g ? column(src, g[k]) : []);
        const ys = YS.flatMap(k => k in g ? column(src, g[k]) : []);
        glyphs.push({type: g.type, xs, ys, cats: 'y' in g && g.y && g.y.field ? [...(src.data[g.y.field] || [])] : []});
      }
      const labels = [];
      for (const a of m.center) {
        if (a.type !== 'LabelSet' || a.y_units === 'screen' || !a.visible) continue;
        const d = a.source.data, n = (d[a.x.field] || []).length;
        ctx.font = `${a.text_font_style && a.text_font_style.value || 'normal'} ${a.text_font_size.value || a.text_font_size} helvetica`;
        for (let i = 0; i < n; i++) {
          const sx = view.frame.x_scale.compute(d[a.x.field][i]);
          const sy = view.frame.y_scale.compute(d[a.y.field][i]);
          if (!(sx >= f.left && sx <= f.right && sy >= f.top && sy <= f.bottom)) continue;
          const text = String(d[a.text.field][i]);
          const w = ctx.measureText(text).width, h = 12;
          const dx = a.x_offset && a.x_offset.field ? d[a.x_offset.field][i] : (a.x_offset.value ?? a.x_offset ?? 0);
          const dy = a.y_offset && a.y_offset.field ? d[a.y_offset.field][i] : (a.y_offset.value ?? a.y_offset ?? 0);
          const align = a.text_align.value || a.text_align;
          const left = sx + dx - (align === 'right' ? w : align === 'center' ? w / 2 : 0);
          const base = a.text_baseline.value || a.text_baseline;
          const top = sy - dy - (base === 'top' ? 0 : base === 'middle' ? h / 2 : h);
          labels.push({text, box: [left, top, left + w, top + h]});
        }
      }
      const t = m.title;
      if (!m.visible) return;  // a chart not drawn (a CPU run's allocator)
      ctx.font = `${t.text_font_style} ${t.text_font_size} helvetica`;
      out.push({title: t.text, title_px: ctx.measureText(t.text).width,
                width: view.bbox.width, frame: [f.left, f.top, f.right, f.bottom],
                x_label: m.below.map(a => a.axis_label).join(' '), x: range(m.x_range),
                y: range(m.y_range), glyphs, labels});
    }
    const kids = [...(view.child_views || [])];
    if (view.renderer_views) kids.push(...view.renderer_views.values());
    for (const k of kids) visit(k);
  };
  for (const r of Object.values(Bokeh.index)) visit(r);
  return out;
}
"""

#: words split over two lines: every status, table header and cell word, by its own boxes
BROKEN_JS = """
() => {
  const broken = [];
  const check = (el) => {
    for (const node of el.childNodes) {
      if (node.nodeType !== Node.TEXT_NODE) continue;
      const re = /\\S+/g; let m;
      while ((m = re.exec(node.textContent))) {
        const r = document.createRange();
        r.setStart(node, m.index); r.setEnd(node, m.index + m[0].length);
        const lines = new Set([...r.getClientRects()].filter(b => b.width > 0).map(b => Math.round(b.top)));
        if (lines.size > 1) broken.push(m[0]);
      }
    }
  };
  document.querySelectorAll('.tl-finding > span:first-child, th, td').forEach(check);
  const statuses = [...document.querySelectorAll('.tl-finding > span:first-child')]
    .filter(s => s.textContent.startsWith('['));
  return {broken, statuses: statuses.length,
          split_statuses: statuses.filter(s => s.getClientRects().length > 1).map(s => s.textContent),
          page_width: document.documentElement.scrollWidth,
          tables: [...document.querySelectorAll('table.tl-sort')].map(t => {
            const box = t.parentElement, r = t.getBoundingClientRect();
            return {right: r.right, scrolls: getComputedStyle(box).overflowX === 'auto'
                    && box.scrollWidth > box.clientWidth, box_right: box.getBoundingClientRect().right};
          })};
}
"""


def stopped_run() -> tuple[Any, list[list[StepRecord]]]:
    """The profile, and the real step records (what steps.jsonl holds)."""
    steps, sums = make_run(world=4, steps=40, straggler=2)
    for r in (1, 3):
        steps[r] = steps[r][:39]
    real = [list(s) for s in steps]
    for r in (0, 1):  # set-up: a window cut before the first step()
        steps[r].insert(0, StepRecord(step=0, t0=T_START - SETUP_S, t1=T_START, window=True))
    profile = ddp_profile(RankProfiling(every=5, run_dir="/runs/x", steps=steps,
                                        summaries=sums))
    run = profile.payload
    run.outcome = "crashed"
    for r in (1, 3):
        run.ranks[r].error = RankError(type="RuntimeError", t=real[r][-1].t1,
                                       message=f"rank {r} failed on purpose at step 39")
        run.exit_codes[r] = 1
    return profile, real


@pytest.fixture(scope="module")
def report(chromium: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    profile, real = stopped_run()
    path = tmp_path_factory.mktemp("rank-charts") / "report.html"
    path.write_text(kinds.report_html(profile), encoding="utf-8")
    page = chromium.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_viewport_size({"width": FRAME, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_function("window.Bokeh && Bokeh.documents.length > 0", timeout=30_000)
    page.wait_for_timeout(2000)
    page.screenshot(path=str(SHOTS / "rank-profile-charts-720.png"), full_page=True)
    yield page, page.evaluate(PLOTS_JS), real
    assert errors == []
    page.close()


def _plot(plots: list[dict[str, Any]], title: str) -> dict[str, Any]:
    found = [p for p in plots if p["title"].startswith(title)]
    assert len(found) == 1, [p["title"] for p in plots]
    return found[0]


def _extent(values: list[float]) -> tuple[float, float]:
    return min(values), max(values)


def _covers_and_hugs(name: str, rng: dict[str, Any], values: list[float],
                     zero: bool = False) -> None:
    """``rng`` holds every value and is at most PADDING wider than they span
    (``zero``: the axis starts at 0 on purpose, a quantity)."""
    lo, hi = _extent(values)
    if zero:
        lo = min(lo, 0.0)
    start, end = sorted((rng["start"], rng["end"]))
    assert start <= lo and hi <= end, (name, rng, lo, hi)
    span = (hi - lo) or abs(hi) or 1.0
    assert end - start <= span * (1 + 2 * PADDING), (name, rng, lo, hi)


def test_every_chart_range_covers_what_it_draws_and_nothing_else(report: Any) -> None:
    _, plots, _ = report
    checked = 0
    for p in plots:
        name = p["title"]
        if p["title"].startswith("Latest profiled step"):
            continue  # a window on the newest step by design: its own test below
        xs = [v for g in p["glyphs"] for v in g["xs"]]
        ys = [v for g in p["glyphs"] for v in g["ys"]]
        if "factors" in p["y"]:  # bars per rank: one factor per rank drawn, nothing else
            cats = {c for g in p["glyphs"] for c in g["cats"]}
            assert set(p["y"]["factors"]) == cats, (name, p["y"], cats)
        elif ys:
            _covers_and_hugs(name + " y", p["y"], ys, zero=p["y"]["start"] == 0)
        if xs and max(xs) > min(xs):
            _covers_and_hugs(name + " x", p["x"], xs, zero=p["x"]["start"] == 0)
        checked += 1
    # step time, RSS, the two breakdowns: a CPU run draws no allocator chart
    assert checked >= 4, [p["title"] for p in plots]


def test_timeline_shows_the_newest_profiled_step_within_its_data(report: Any) -> None:
    _, plots, _ = report
    tl = _plot(plots, "Latest profiled step")
    xs = [v for g in tl["glyphs"] for v in g["xs"]]
    lo, hi = _extent(xs)
    assert lo <= tl["x"]["start"] < tl["x"]["end"] <= hi + 0.05 * (tl["x"]["end"] - tl["x"]["start"])
    assert tl["x"]["end"] >= max(x for g in tl["glyphs"] if g["type"] == "Quad" for x in g["xs"])


def test_step_chart_draws_the_real_steps_on_a_step_axis(report: Any) -> None:
    """No set-up point: the range is the steps' (0 to about 126 ms: a duration's
    axis starts at 0), not 8,500 ms."""
    _, plots, real = report
    step = _plot(plots, "Step time per rank")
    assert step["x_label"] == "step"
    ms = [(rec.t1 - rec.t0) * 1e3 for recs in real for rec in recs]
    assert step["y"]["start"] == 0
    _covers_and_hugs("step time", step["y"], ms, zero=True)
    assert max(v for g in step["glyphs"] for v in g["ys"]) < 2 * max(ms)


def test_labels_of_stopped_ranks_lie_inside_their_plot(report: Any) -> None:
    _, plots, _ = report
    labels = [(p["title"], lab) for p in plots for lab in p["labels"]]
    assert {lab["text"] for _, lab in labels} >= {"rank 1", "rank 3"}, labels
    for title, lab in labels:
        p = next(q for q in plots if q["title"] == title)
        left, top, right, bottom = p["frame"]
        x0, y0, x1, y1 = lab["box"]
        assert left <= x0 and x1 <= right and top <= y0 and y1 <= bottom, (title, lab, p["frame"])


def test_a_cpu_run_draws_its_measured_memory_on_an_axis_it_can_be_read_on(report: Any) -> None:
    """A CPU run measures its resident set; its allocator figures are modelled
    at the profiled steps only: no allocator chart reads as a CUDA timeline,
    and one line under the RSS chart says so."""
    page, plots, _ = report
    titles = [p["title"] for p in plots]
    assert not any(t.startswith(("CUDA allocator", "Fragmentation", "Largest free"))
                   for t in titles), titles
    rss = _plot(plots, "Resident memory (RSS)")
    # RSS: about 400 MiB
    low = min(v for g in rss["glyphs"] for v in g["ys"])
    assert low > 300 and rss["y"]["start"] > 0.9 * low, rss["y"]  # its changes, not 0..400
    said = page.evaluate("() => Bokeh.documents.flatMap(d => [...d.all_models])"
                         ".filter(m => m.type === 'Div' && m.visible).map(m => m.text)"
                         ".join(' ')")
    assert "CUDA allocator: not measured (no rank uses CUDA; its figures are modelled at " \
        "the profiled steps only" in said
    box = page.locator(".bk-Column").first.bounding_box()
    assert box and box["width"] <= FRAME
    page.screenshot(path=str(SHOTS / "rank-profile-memory-720.png"), full_page=True,
                    clip={"x": 0, "y": box["y"], "width": FRAME, "height": min(box["height"], 2400)})


def test_nothing_breaks_mid_word_or_is_cut_in_a_720_px_frame(report: Any) -> None:
    page, plots, _ = report
    got = page.evaluate(BROKEN_JS)
    assert got["page_width"] <= FRAME, got["page_width"]
    assert got["statuses"] >= 8 and got["split_statuses"] == [], got
    assert got["broken"] == [], got["broken"]
    for t in got["tables"]:  # whole, or in a box that scrolls to it
        assert t["right"] <= t["box_right"] + 1 or t["scrolls"], t
    for p in plots:
        assert p["title_px"] <= p["width"] - 40, (p["title"], p["title_px"], p["width"])


def test_status_words_stay_whole_in_a_narrow_column(chromium: Any, tmp_path: Path) -> None:
    """The checklist in a column 260 px wide (a split notebook view): a status
    such as "[not applicable]" is never split over two lines."""
    profile, _ = stopped_run()
    path = tmp_path / "narrow.html"
    path.write_text(kinds.report_html(profile), encoding="utf-8")
    page = chromium.new_page()
    try:
        page.set_viewport_size({"width": 300, "height": 900})
        page.goto(path.as_uri())
        page.wait_for_timeout(500)
        got = page.evaluate(BROKEN_JS)
        assert got["statuses"] >= 8 and got["split_statuses"] == [], got
        assert got["page_width"] <= 300, got["page_width"]
        page.screenshot(path=str(SHOTS / "rank-profile-narrow.png"))
    finally:
        page.close()
