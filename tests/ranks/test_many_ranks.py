"""The live views of a job of many ranks (``render.ranks.view`` and
``render.ddp.heartbeats`` above ``SHOWN_RANKS`` ranks): a line for each rank to look at,
the spread of all of them, and a size that does not grow with the job."""

from __future__ import annotations

from statistics import median

import pytest
from bokeh.models import GlyphRenderer

from ranks.rank_fixtures import MIB, T_START, make_run
from torchlens.analysis.ranks.spread import SHOWN_RANKS
from torchlens.frontends.shared.live_view import ProfiledLiveView
from torchlens.model.messages import DdpHeartbeat
from torchlens.model.payloads import RankProfiling
from torchlens.render.ddp.heartbeats import LivePlot, rank_figures
from torchlens.render.ranks.view import RankProfileView, rank_profile_figures

WORLD = 64
SLOW = 61
KILLED = 40


def renderers(fig) -> list:
    return [r for r in fig.renderers if isinstance(r, GlyphRenderer)]


def run_view(world: int = WORLD, steps: int = 30) -> tuple[RankProfileView, list, list]:
    records, sums = make_run(world=world, steps=steps, straggler=SLOW)
    view = RankProfileView(world, every=5, modelled=True, t0=T_START)
    for r in range(world):
        view.push_steps(r, records[r])
        for s in sums[r]:
            view.push_summary(r, s)
    view.flush(force=True)
    return view, records, sums


def test_the_slow_rank_gets_a_line_and_every_rank_is_in_the_band() -> None:
    view, records, _ = run_view()
    p = view.panels
    assert len(p.shown) == SHOWN_RANKS and p.shown[0] == SLOW
    legend = [item.label.value for item in p.step_fig.legend[0].items]
    assert f"rank {SLOW}" in legend and f"all {WORLD} ranks" in legend
    # the slow rank's line holds its own steps, drawn thickest
    slot = p.shown.index(SLOW)
    assert p.steps[slot].data["step"] == list(range(30))
    assert p.step_lines[slot].glyph.line_width > p.step_lines[(slot + 1) % 16].glyph.line_width
    # the memory band spans every rank's RSS at each step (the fixture: 400 + rank MiB)
    band = p.mem_spread.data
    step = band["step"].index(12)
    rss = [records[r][12].mem.rss / MIB for r in range(WORLD)]
    assert band["rss_lo"][step] == pytest.approx(min(rss))
    assert band["rss_hi"][step] == pytest.approx(max(rss))
    assert band["rss_mid"][step] == pytest.approx(median(rss))
    assert band["ranks"][step] == WORLD
    # the bars are for the ranks drawn, not 64 rows
    assert list(reversed(p.bd_fig.y_range.factors)) == [f"rank {r}" for r in p.shown]
    assert p.breakdown.data["rank"] == [f"rank {r}" for r in p.shown]


def test_the_view_does_not_grow_with_the_job() -> None:
    small, _, _ = run_view(world=SHOWN_RANKS + 1, steps=6)
    big, _, _ = run_view(world=512, steps=6)
    for name in ("step_fig", "mem_fig", "frag_fig", "free_fig"):
        assert len(renderers(getattr(big.panels, name))) == len(
            renderers(getattr(small.panels, name))), name
    assert big.panels.bd_fig.height == small.panels.bd_fig.height
    # timeline lanes: the ranks drawn only
    assert {r for r, _ in big.panels.lanes.slot} <= set(big.panels.shown)


def test_a_rank_that_stops_early_is_drawn_and_marked_at_once() -> None:
    view, records, _ = run_view()
    assert KILLED not in view.panels.shown
    view.rank_ended(KILLED, "killed by SIGKILL", records[KILLED][20].t1)
    view.flush(force=True)
    p = view.panels
    assert KILLED in p.shown
    assert p.steps[p.shown.index(KILLED)].data["step"] == list(range(30))
    assert p.ended.data["text"] == [f"rank {KILLED}: killed by SIGKILL"]
    assert p.ended.data["step"] == [20]
    assert any(item.label.value == f"rank {KILLED}" for item in p.step_fig.legend[0].items)
    # a rank that finished is no reason for a line
    assert 50 not in p.shown
    view.rank_ended(50, "finished", records[50][-1].t1)
    view.flush(force=True)
    assert 50 not in p.shown and p.ended.data["text"] == [f"rank {KILLED}: killed by SIGKILL"]


def test_new_steps_of_many_ranks_patch_the_band_rather_than_resend_it() -> None:
    records, sums = make_run(world=WORLD, steps=20, straggler=SLOW)
    view = RankProfileView(WORLD, every=5, modelled=True, t0=T_START)
    # ranks 0..31 send steps 0..9 first, the others later: step 5's band widens
    for r in range(32):
        view.push_steps(r, records[r][:10])
    view.flush(force=True)
    band = view.panels.mem_spread.data
    assert band["ranks"][5] == 32 and band["rss_hi"][5] == pytest.approx(
        records[31][5].mem.rss / MIB)
    for r in range(WORLD):
        view.push_steps(r, records[r][10:] if r < 32 else records[r])
    view.flush(force=True)
    band = view.panels.mem_spread.data
    assert band["step"] == list(range(20)) and band["ranks"] == [WORLD] * 20
    assert band["rss_hi"][5] == pytest.approx(records[WORLD - 1][5].mem.rss / MIB)


def test_the_static_copy_draws_the_same_ranks_as_the_live_view() -> None:
    view, records, sums = run_view()
    prof = RankProfiling(every=5, steps=records, summaries=sums)
    layout = rank_profile_figures(prof, WORLD, T_START)
    step_fig = layout.children[1]
    assert [item.label.value for item in step_fig.legend[0].items] == [
        item.label.value for item in view.panels.step_fig.legend[0].items]


def test_heartbeats_of_many_ranks_are_points_of_one_source() -> None:
    plot = LivePlot(WORLD)
    mem, coll, lanes = plot.layout.children
    assert len(renderers(mem)) == 1 and len(renderers(coll)) == 1
    assert lanes.height <= 60 + 900 + WORLD
    assert len(lanes.yaxis.ticker.ticks) <= 40
    for t in range(3):
        for r in range(WORLD):
            plot.push(DdpHeartbeat(rank=r, t_rel=float(t), phase="step", collectives=t,
                                   rss=(100 + r) * MIB))
    plot.flush(force=True)
    src = renderers(mem)[0].data_source
    assert len(src.data["t"]) == 3 * WORLD and set(src.data["rank"]) == set(range(WORLD))
    # the static copy draws the same points
    static = rank_figures([DdpHeartbeat(rank=r, t_rel=0.0, phase="step", rss=MIB)
                           for r in range(WORLD)], WORLD)
    assert len(renderers(static.children[0])[0].data_source.data["t"]) == WORLD


def test_a_few_ranks_still_get_a_line_each() -> None:
    view = ProfiledLiveView(4, 5, True)
    assert len(view.profile.panels.step_lines) == 4 and not view.profile.panels.spread
    # per rank: a memory line, a tensors line and a point per heartbeat
    assert len(renderers(view.beats.layout.children[0])) == 12


@pytest.mark.parametrize("world", [4, WORLD])
def test_drawing_adds_no_model_to_the_document(world: int) -> None:
    """``torchlens.watch`` flushes from its thread while the kernel may be
    serializing the document for the browser: a model added then broke the
    watch ("Set changed size during iteration", seen in JupyterLab)."""
    records, sums = make_run(world=world, steps=30, straggler=world - 3)
    view = ProfiledLiveView(world, 5, True)
    before = {m.id for m in view.layout.references()}
    for r in range(world):
        view.push_steps(r, records[r])
        for s in sums[r]:
            view.push_summary(r, s)
        view.push(DdpHeartbeat(rank=r, t_rel=1.0, phase="step", rss=MIB))
    view.profile.rank_ended(1, "killed by SIGKILL", records[1][10].t1)
    view.profile.flush(force=True)
    view.beats.flush(force=True)
    assert {m.id for m in view.layout.references()} == before


def test_a_long_backlog_is_banded_whole() -> None:
    """A watch opening a long-running job, or the static copy, gets every step's
    band, though the view holds each rank's values for the newest steps only."""
    view, _, _ = run_view(world=SHOWN_RANKS + 4, steps=400)
    assert view.panels.step_spread.data["step"] == list(range(400))
    assert view.panels.mem_spread.data["ranks"] == [SHOWN_RANKS + 4] * 400
