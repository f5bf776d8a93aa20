"""The live step chart names the steps that were profiled, not only the interval
(never "profiled steps (1 in 48)" under a 30-step run whose steps 4 and 9 were)."""

from __future__ import annotations

from ranks.rank_fixtures import T_START, make_run
from torchlens.render.ranks.view import RankProfileView


def _flag(steps, profiled):
    return [[rec.replace(profiled=rec.step in profiled) for rec in recs] for recs in steps]


def test_the_step_chart_names_the_profiled_steps_then_the_interval() -> None:
    steps, _ = make_run(world=2, steps=30, straggler=1)
    steps = _flag(steps, {4, 9})
    view = RankProfileView(2, every=48, modelled=False, t0=T_START)
    assert "profiled steps (none yet; then 1 in 48)" in view.panels.step_note.text
    for r in range(2):
        view.push_steps(r, steps[r])
    view.flush(force=True)
    note = view.panels.step_note.text
    assert "profiled steps 4, 9 (then 1 in 48)" in note, note
    assert "(1 in 48)" not in note


def test_a_long_run_lists_the_first_and_last_profiled_steps() -> None:
    steps, _ = make_run(world=2, steps=120, straggler=1)
    steps = _flag(steps, {4, 9, *range(20, 120, 10)})
    view = RankProfileView(2, every=10, modelled=False, t0=T_START)
    for r in range(2):
        view.push_steps(r, steps[r])
    view.flush(force=True)
    note = view.panels.step_note.text
    assert "profiled steps 4, 9, 20, 30, …, 110 (12 steps; then 1 in 10)" in note, note
