"""The ``%ddp_check --profile`` views (``render.ranks.view``) fed synthetic records.

A 4-rank run whose rank 2 spends 30 ms more per step loading data (the others
wait for it in backward) goes through ``RankProfileView`` as the kernel would
send it; the checks are on the Bokeh sources: what each flush streams, what
stays bounded, what the verdict and the markers say, and that the static copy
(``rank_profile_figures``) draws the same points.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest
from bokeh.models import ColumnDataSource, Div, HoverTool
from markupsafe import escape

from ranks.rank_fixtures import T_START, make_run
from torchlens.analysis.ranks.slow import SlowRank
from torchlens.frontends import kinds
from torchlens.model import DdpRun, Profile
from torchlens.model.findings import Figure, Finding
from torchlens.model.payloads import RankProfiling
from torchlens.model.rank_report import RankError
from torchlens.render.ranks import view as rank_view
from torchlens.render.ranks.view import RankProfileView, rank_profile_figures

HOSTILE = "<img src=x onerror=alert(1)></script><script>alert(2)</script>\"'><svg onload=alert(3)>"
WORLD = 4
STRAGGLER = 2


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """Rows handed to ``ColumnDataSource.stream``, by source id."""
    rows: Counter[int] = Counter()
    real = ColumnDataSource.stream

    def counting(self: ColumnDataSource, new_data: dict[str, Any], rollover: Any = None,
                 **kw: Any) -> None:
        rows[id(self)] += len(next(iter(new_data.values())))
        real(self, new_data, rollover, **kw)

    monkeypatch.setattr(ColumnDataSource, "stream", counting)
    return rows


def feed(view: RankProfileView, steps: list[list[dict[str, Any]]],
         summaries: list[list[dict[str, Any]]], lo: int = 0, hi: int | None = None) -> None:
    """The records of steps ``lo <= step < hi``, as the kernel sends them."""
    for r in range(len(steps)):
        batch = [s for s in steps[r] if lo <= s.step < (hi if hi is not None else 1 << 30)]
        view.push_steps(r, batch)
        for s in summaries[r]:
            if lo <= s["step"] < (hi if hi is not None else 1 << 30):
                view.push_summary(r, s)


def growing(view: RankProfileView) -> dict[str, ColumnDataSource]:
    """Every source that grows by streaming, by a readable name."""
    p = view.panels
    out = {name: getattr(p, name)
           for name in ("profiled", "mem_marks", "ops", "colls", "arrivals", "last")}
    for r in range(view.world_size):
        for name in ("steps", "mem", "mem_prof"):
            out[f"{name}[{r}]"] = getattr(p, name)[r]
    return out


def size(src: ColumnDataSource) -> int:
    return len(next(iter(src.data.values())))


def test_every_panel_grows_and_only_new_rows_are_streamed(streamed: Counter[int]) -> None:
    steps, sums = make_run(world=WORLD, steps=40, straggler=STRAGGLER)
    view = RankProfileView(WORLD, every=5, modelled=True, t0=T_START)
    sources = growing(view)
    assert all(size(s) == 0 for s in sources.values())

    feed(view, steps, sums, 0, 20)
    view.flush(force=True)
    first = {name: size(s) for name, s in sources.items()}
    assert all(first.values()), [n for n, v in first.items() if not v]
    assert first["steps[0]"] == 20 and first["profiled"] == 4 * 4 and first["mem[3]"] == 20
    assert first["mem_prof[1]"] == 4  # the modelled figures of the profiled steps
    assert first["mem_marks"] == 4 * 4
    assert first["arrivals"] == 4 * 3 and first["last"] == 4 * 3  # 4 steps x 3 collectives
    bd = view.panels.breakdown.data
    assert bd["data_ms"][STRAGGLER] > bd["data_ms"][0] > 0

    feed(view, steps, sums, 20, 40)
    view.flush(force=True)
    for name, src in sources.items():
        # every row went once: nothing was sent again
        assert streamed[id(src)] == size(src), name
        assert size(src) > first[name], name
    assert size(sources["steps[2]"]) == 40 and size(sources["profiled"]) == 8 * 4

    before, flushes = sum(streamed.values()), view.flushes
    view.flush(force=True)  # nothing new: nothing streamed
    assert sum(streamed.values()) == before and view.flushes == flushes


def test_flush_is_rate_limited_but_at_least_twice_a_second() -> None:
    steps, sums = make_run(world=2, steps=10, straggler=1)
    view = RankProfileView(2, every=5, modelled=True)
    assert rank_view.FLUSH_S <= 0.5
    feed(view, steps, sums, 0, 5)
    view.flush()
    assert view.flushes == 1
    feed(view, steps, sums, 5, 10)
    view.flush()  # right after the last one: held back
    assert view.flushes == 1 and size(view.panels.steps[0]) == 5
    view._last_flush -= rank_view.FLUSH_S
    view.flush()
    assert view.flushes == 2 and size(view.panels.steps[0]) == 10
    assert view.t0 == steps[0][0].t0  # no t0 given: the first record's start


def test_verdict_names_the_slow_rank_and_its_line_stands_out() -> None:
    steps, sums = make_run(world=WORLD, steps=40, straggler=STRAGGLER)
    view = RankProfileView(WORLD, every=5, modelled=True, t0=T_START)
    assert "Waiting" in view.panels.verdict.text
    feed(view, steps, sums)
    view.flush(force=True)
    text = view.panels.verdict.text
    assert f"rank {STRAGGLER}" in text and "data" in text and "skew" in text
    widths = [line.glyph.line_width for line in view.panels.step_lines]
    assert widths[STRAGGLER] > max(w for r, w in enumerate(widths) if r != STRAGGLER)


def test_last_arrival_is_the_straggler() -> None:
    steps, sums = make_run(world=WORLD, steps=20, straggler=STRAGGLER)
    view = RankProfileView(WORLD, every=5, modelled=True, t0=T_START)
    feed(view, steps, sums)
    view.flush(force=True)
    last = view.panels.last.data
    assert set(last["last"]) == {f"rank {STRAGGLER}"}
    assert all(abs(ms - 30.0) < 1e-3 for ms in last["spread_ms"])
    # CPU summaries carry no kernel start: arrivals are the hosts' issues, and say so
    assert set(last["arrived_by"]) == {"when its host issued the call"}
    lanes = view.panels.lanes
    # the marker sits on the straggler's lane, the segment visits every rank
    assert {y for y in last["y"]} == {lanes.slot[(STRAGGLER, f"cpu {2000 + STRAGGLER} autograd")]}
    assert all(len(xs) == WORLD for xs in view.panels.arrivals.data["xs"])


def test_collectives_wait_for_every_running_rank() -> None:
    steps, sums = make_run(world=3, steps=5, straggler=1)
    view = RankProfileView(3, every=5, modelled=True, t0=T_START)
    feed(view, steps[:2] + [[]], sums[:2] + [[]])
    view.flush(force=False)
    assert size(view.panels.arrivals) == 0  # rank 2's summary of the step is missing
    view.rank_ended(2, "SIGKILL", T_START + 0.3)
    view._last_flush = 0
    view.flush()
    assert size(view.panels.arrivals) == 3  # rank 2 is gone: join what the others sent


def test_hostile_names_are_text(monkeypatch: pytest.MonkeyPatch) -> None:
    steps, sums = make_run(world=2, steps=10, straggler=1, op_name=HOSTILE)
    for s in sums[0]:
        s["lanes"] = [HOSTILE, "stream 7"]
        s["collectives"][0]["name"] = HOSTILE
    words = f"rank 1 is slow in {HOSTILE}"
    said = Finding("warning", words, (Figure(HOSTILE, HOSTILE),), HOSTILE)
    monkeypatch.setattr(rank_view, "slow_rank", lambda steps, window=20: SlowRank(
        1, "data", said, 30.0, 1.0, 25.0, 110.0, 20))
    view = RankProfileView(2, every=5, modelled=True, t0=T_START)
    feed(view, steps, sums)
    view.rank_ended(1, HOSTILE, T_START + 1)
    view.flush(force=True)
    div = view.panels.verdict.text
    assert HOSTILE not in div and str(escape(words)) in div and "<img" not in div
    assert HOSTILE in view.panels.ops.data["name"]  # data: BokehJS writes it as text
    assert HOSTILE in view.panels.colls.data["name"]
    for hover in view.layout.select({"type": HoverTool}):
        assert "{safe}" not in str(hover.tooltips)  # no field is shown as HTML
    for div in view.layout.select({"type": Div}):
        assert "<img" not in div.text and "<script" not in div.text


def test_timeline_stays_bounded_with_many_profiled_steps(streamed: Counter[int]) -> None:
    steps, sums = make_run(world=WORLD, steps=200, every=2, ops_per_step=400, collectives=60)
    view = RankProfileView(WORLD, every=2, modelled=True, t0=T_START)
    for lo in range(0, 200, 20):
        feed(view, steps, sums, lo, lo + 20)
        view.flush(force=True)
    p = view.panels
    assert size(p.ops) == rank_view.TIMELINE_ROWS < streamed[id(p.ops)]
    assert size(p.colls) == rank_view.COLLECTIVE_ROWS < streamed[id(p.colls)]
    assert size(p.arrivals) == rank_view.ARRIVAL_ROWS < streamed[id(p.arrivals)]
    # each summary keeps its longest ops only: a share of the per-step budget
    per_summary = max(50, rank_view.OPS_BUDGET // WORLD)
    assert streamed[id(p.ops)] == 100 * WORLD * min(400, per_summary)
    assert min(p.ops.data["ms"]) >= 0.9 * 110 / 400 * 0.4
    # the x range shows the newest profiled step
    newest = sums[0][-1]
    assert p.tl_fig.x_range.start < newest["t0"] - T_START < p.tl_fig.x_range.end
    assert p.tl_fig.x_range.end - p.tl_fig.x_range.start < 2 * (newest["t1"] - newest["t0"])


def test_rank_ended_marks_its_last_step_and_its_lanes() -> None:
    steps, sums = make_run(world=WORLD, steps=30, straggler=STRAGGLER)
    steps[3], sums[3] = steps[3][:17], [s for s in sums[3] if s["step"] < 17]
    view = RankProfileView(WORLD, every=5, modelled=True, t0=T_START)
    feed(view, steps, sums)
    view.flush()
    t_end = steps[3][-1].t1 + 0.01
    view.rank_ended(3, "RuntimeError: boom", t_end)
    view.flush(force=True)
    ended = view.panels.ended.data
    assert ended["step"] == [16] and ended["step_ms"] == [pytest.approx(
        (steps[3][-1].t1 - steps[3][-1].t0) * 1e3)]
    assert ended["text"] == ["rank 3: RuntimeError: boom"]
    ends = view.panels.tl_ends.data
    top, bottom = view.panels.lanes.group(3)
    assert ends["x"] == [pytest.approx(t_end - T_START)]
    assert (ends["y0"], ends["y1"]) == ([top], [bottom])
    labels = view.panels.tl_fig.yaxis.major_label_overrides
    assert all("(ended)" in text for text in labels.values() if text.startswith("rank 3"))
    assert not any("(ended)" in text for text in labels.values() if text.startswith("rank 0"))


def test_a_new_lane_moves_the_rows_below_it() -> None:
    steps, sums = make_run(world=2, steps=5, straggler=1)
    view = RankProfileView(2, every=5, modelled=True, t0=T_START)
    view.push_summary(1, sums[1][0])
    view.flush(force=True)
    ys = {(r, lane): y for (r, lane), y in view.panels.lanes.slot.items()}
    assert set(ys.values()) == {0, 1}
    view.push_summary(0, sums[0][0])  # rank 0's lanes go above rank 1's
    view._last_flush = 0
    view.flush(force=True)
    p = view.panels
    slot = p.lanes.slot
    for rank, lane, top, bottom in zip(p.ops.data["rank"], p.ops.data["lane"],
                                       p.ops.data["top"], p.ops.data["bottom"], strict=True):
        assert slot[(rank, lane)] - 0.5 <= top < bottom <= slot[(rank, lane)] + 0.5
    assert size(p.ops) == 2 * 30 and p.tl_fig.height > 120
    odd = {**sums[0][0], "step": 9, "lanes": [],
           "ops": [{**sums[0][0]["ops"][0], "lane": 7}],
           "collectives": [{**sums[0][0]["collectives"][0], "lane": -1}]}
    view.push_summary(0, odd)  # no lane names, indexes out of range: drawn on a lane
    view.flush(force=True)
    assert p.ops.data["lane"][-1] == p.colls.data["lane"][-1] == "lane 0"


def test_memory_titles_say_where_the_numbers_come_from() -> None:
    # a CPU run: its allocator figures are modelled at the profiled steps only,
    # which drawn by step read as a CUDA allocator's timeline: the measured
    # resident set is drawn, and one line says what the allocator figures are
    steps, sums = make_run(world=2, steps=10, straggler=1)
    view = RankProfileView(2, every=5, modelled=True)
    p = view.panels
    feed(view, steps, sums)
    view.flush(force=True)
    assert not any(f.visible for f in (p.mem_fig, p.frag_fig, p.free_fig, p.alloc_row))
    assert p.rss_fig.visible and p.rss_fig.title.text.startswith("Resident memory (RSS)")
    assert p.mem_note.text.startswith("CUDA allocator: not measured (no rank uses CUDA")
    assert "modelled at the profiled steps only" in p.mem_note.text
    assert "\n" not in p.mem_note.text and p.mem_note.text.count(". ") == 0  # one line

    assert all(v != v for v in p.mem[0].data["heap"])  # no C heap figure: NaN, none drawn

    rss_only = RankProfileView(2, every=5, modelled=False)
    feed(rss_only, steps, [[], []])
    rss_only.flush(force=True)
    assert not rss_only.panels.mem_fig.visible
    assert rss_only.panels.mem_note.text.startswith("CUDA allocator: not measured")
    assert rss_only.panels.rss_fig.title.text.startswith("Resident memory (RSS)")

    steps, sums = make_run(world=2, steps=10, straggler=1, cuda=True)
    cuda = RankProfileView(2, every=5, modelled=False)
    feed(cuda, steps, sums)
    cuda.flush(force=True)
    assert cuda.panels.mem_fig.title.text.startswith("CUDA")
    assert cuda.panels.mem_fig.visible and cuda.panels.frag_fig.visible
    assert not any(line.visible for line in cuda.panels.prof_lines)
    frag = cuda.panels.mem[0].data["frag"]
    assert frag[0] == pytest.approx(100 * 8 / 160)  # inactive split / reserved, in %


def test_widget_is_made_on_first_use() -> None:
    view = RankProfileView(2, every=5, modelled=True)
    assert view._widget is None
    from jupyter_bokeh import BokehModel

    assert isinstance(view.widget, BokehModel) and view.widget is view.widget


def _points(layout: Any) -> list[tuple[str, int]]:
    return sorted((",".join(sorted(s.data)), size(s))
                  for s in layout.select({"type": ColumnDataSource}))


def test_static_figures_draw_what_the_live_view_drew() -> None:
    steps, sums = make_run(world=WORLD, steps=33, straggler=STRAGGLER)
    steps[1] = steps[1][:21]
    sums[1] = [s for s in sums[1] if s["step"] < 21]
    end = steps[1][-1].t1
    live = RankProfileView(WORLD, every=5, modelled=True, t0=T_START)
    for lo in range(0, 33, 7):  # in batches, flushed in between
        feed(live, steps, sums, lo, lo + 7)
        live.flush(force=True)
    live.rank_ended(1, "exit code 1", end)
    live.flush(force=True)
    static = rank_profile_figures(RankProfiling(every=5, steps=steps, summaries=sums),
                                  WORLD, T_START, {1: "exit code 1"})
    assert _points(static) == _points(live.layout)
    words = sorted(d.text for d in static.select({"type": Div}))  # the verdict, the captions
    assert words == sorted(d.text for d in live.layout.select({"type": Div}))
    assert live.panels.verdict.text in words


def ddp_profile(profiling: RankProfiling | None, name: str = "train") -> Profile:
    ranks: list[dict[str, Any] | None] = [
        {"rank": r, "pid": 10 + r, "device": "cpu", "steps": [], "log": ""} for r in range(WORLD)]
    run = DdpRun(world_size=WORLD, backend="gloo", outcome="finished", steps=1, t0=T_START,
                 ranks=ranks, fingerprints=[[] for _ in range(WORLD)],
                 exit_codes=[0] * WORLD, ended_at=[None] * WORLD, profiling=profiling)
    return Profile(kind="ddp_check", title=name, created_at=1_700_000_000.0, source=name,
                   environment={}, payload=run)


def _section(html: str, anchor: str) -> str:
    m = re.search(rf'<section id="{anchor}">(.*?)</section>', html, re.S)
    assert m, anchor
    return m.group(1)


def test_ddp_report_shows_the_profiling_section() -> None:
    steps, sums = make_run(world=WORLD, steps=20, straggler=STRAGGLER)
    html = kinds.report_html(ddp_profile(RankProfiling(every=5, run_dir="/runs/x", steps=steps,
                                                       summaries=sums)))
    body = _section(html, "rank-profile")
    assert "Per-rank steps, memory and timeline" in html
    assert 'class="bk-root"' in body or "data-root-id" in body  # the figures' div
    assert "<table" in body and "median step" in body and "/runs/x" in body
    assert "modelled" in body
    # a row per rank in each table: times, allocator, resident set
    assert len(re.findall(r"<tr>\s*<td", body)) == 3 * WORLD
    plain = kinds.report_html(ddp_profile(None))
    assert 'id="rank-profile"' not in plain


def test_ddp_report_with_hostile_names_is_clean() -> None:
    steps, sums = make_run(world=WORLD, steps=10, straggler=STRAGGLER, op_name=HOSTILE)
    for s in sums[0]:
        s["lanes"] = [HOSTILE, HOSTILE + "2"]
        s["collectives"][0]["name"] = HOSTILE
    profile = ddp_profile(RankProfiling(every=5, run_dir=HOSTILE, steps=steps, summaries=sums),
                          name=HOSTILE)
    profile.payload.ranks[1].error = RankError(type="RuntimeError", message=HOSTILE,
                                               t=steps[1][-1].t1)
    profile.payload.exit_codes[1] = 1
    html = kinds.report_html(profile)
    for part in ("<img src=x", "<svg onload", "alert(2)</script>"):
        assert part not in html
    assert str(escape(HOSTILE)) in _section(html, "rank-profile")


def test_profiled_steps_breakdown_panel_shows_torchprof_roles_per_rank() -> None:
    """The %%torchprof breakdown of each rank's profiled steps: the panel's bars are
    the median over that rank's summaries, role by role."""
    from torchlens.render.ranks.view import RankProfileView

    steps, sums = make_run(world=2, steps=20)
    for r, rank_sums in enumerate(sums):
        for i, s in enumerate(rank_sums):
            s["breakdown"] = {"cpu_exec_us": 1000.0 * (r + 1) + i, "dataloader_us": 500.0 * r,
                              "other_us": 100.0}
    view = RankProfileView(2, 5, True)
    for r in range(2):
        view.push_steps(r, steps[r])
        for s in sums[r]:
            view.push_summary(r, s)
    view.flush(force=True)
    data = view.panels.roles.data
    for r in range(2):
        cpu = sorted(1000.0 * (r + 1) + i for i in range(len(sums[r])))
        mid = len(cpu) // 2
        expected = cpu[mid] if len(cpu) % 2 else (cpu[mid - 1] + cpu[mid]) / 2
        assert data["cpu_exec_ms"][r] == pytest.approx(expected / 1000)
        assert data["dataloader_ms"][r] == pytest.approx(0.5 * r)
        assert data["profiled"][r] == len(sums[r])
    assert "%%torchprof" in view.panels.roles_fig.title.text


def test_a_rank_that_finished_gets_no_red_mark() -> None:
    """Every rank that reached --steps was marked with a red x like a crash."""
    steps, sums = make_run(world=WORLD, steps=12, straggler=STRAGGLER)
    view = RankProfileView(WORLD, every=5, modelled=True, t0=T_START)
    feed(view, steps, sums)
    for r in range(WORLD):
        view.rank_ended(r, "finished", steps[r][-1].t1)
    view.flush(force=True)
    assert view.panels.ended.data["step"] == [] and view.panels.tl_ends.data["x"] == []


def test_a_cpu_run_draws_the_c_heap_its_step_records_measured() -> None:
    """A CPU run's step records carry the C heap in use (glibc's figure, which
    falls when memory is freed, as RSS seldom does): drawn per rank, in MiB."""
    steps, sums = make_run(world=2, steps=10, straggler=1)
    steps = [[rec.replace(mem=rec.mem.replace(heap=(100 + r) * 2**20 + rec.step * 4096))
              for rec in recs] for r, recs in enumerate(steps)]
    view = RankProfileView(2, every=5, modelled=True)
    feed(view, steps, sums)
    view.flush(force=True)
    p = view.panels
    assert p.heap_fig.title.text.startswith("C heap in use per rank")
    assert p.mem[1].data["heap"][0] == pytest.approx(101.0)
    assert p.mem[1].data["heap"][-1] == pytest.approx(101.0 + 9 * 4096 / 2**20)
    assert "C heap in use" in p.mem_note.text


def test_the_step_breakdown_names_time_outside_the_phases_between_phases() -> None:
    """The watch's per-rank breakdown: the step's time no phase timer saw (a
    sleep) is "between phases" in its legend and tooltip, not a phase "other"."""
    from torchlens.render.ranks.panels import Panels

    panels = Panels(2, 1, False)
    labels = [item.label.value for item in panels.bd_fig.legend[0].items]
    assert "between phases" in labels and "other" not in labels
    tips = [t for tool in panels.bd_fig.tools if isinstance(tool, HoverTool)
            for t, _ in tool.tooltips]
    assert "between phases" in tips and "other" not in tips
