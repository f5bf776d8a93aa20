"""Many ranks shown as a few (``analysis.ranks.spread``): the spread across
ranks per step, and which ranks a view draws on their own."""

from __future__ import annotations

import math

import pytest

from torchlens.analysis.ranks.spread import Spread, ranks_to_show
from torchlens.analysis.ranks.verdict import RankRow


def test_spread_gives_each_step_its_range_and_median_once() -> None:
    spread = Spread(("step_ms",))
    for rank, ms in enumerate([10.0, 30.0, 20.0, 100.0]):
        spread.add(rank, [{"step": 0, "step_ms": ms}, {"step": 1, "step_ms": ms + 1}])
    cols = spread.changed()
    assert cols["step"] == [0, 1] and cols["ranks"] == [4, 4]
    assert (cols["step_ms_lo"], cols["step_ms_mid"], cols["step_ms_hi"]) == (
        [10.0, 11.0], [25.0, 26.0], [100.0, 101.0])
    # nothing new: nothing to send again; a rank that sends a step again replaces its value
    assert spread.changed()["step"] == []
    spread.add(3, [{"step": 0, "step_ms": 5.0}])
    cols = spread.changed()
    assert cols["step"] == [0] and cols["step_ms_lo"] == [5.0] and cols["step_ms_hi"] == [30.0]


def test_spread_skips_what_was_not_measured_and_forgets_old_steps() -> None:
    spread = Spread(("rss", "allocated"), keep=8)
    spread.add(0, [{"step": 0, "rss": 1.0, "allocated": None}])
    spread.add(1, [{"step": 0, "rss": float("nan"), "allocated": None}])
    cols = spread.changed()
    assert cols["rss_lo"] == [1.0] and cols["ranks"] == [1]
    assert math.isnan(cols["allocated_mid"][0])
    # steps not sent yet are all sent (a view's first flush of a long backlog) ...
    spread.add(0, [{"step": s, "rss": float(s)} for s in range(1, 40)])
    assert spread.changed()["step"] == list(range(1, 40))
    # ... then only the newest ``keep`` are held (in batches)
    spread.add(0, [{"step": 40, "rss": 40.0}])
    spread.changed()
    spread.add(1, [{"step": s, "rss": 1.0} for s in range(41)])
    kept = spread.changed()["step"]
    assert 8 <= len(kept) <= 9 and kept[-1] == 40
    # a rank far behind: its value of a forgotten step would make that step's
    # band one rank wide, so it is dropped
    spread.add(1, [{"step": 2, "rss": 5.0}, {"step": 39, "rss": 50.0}])
    cols = spread.changed()
    assert cols["step"] == [39] and cols["rss_hi"] == [50.0]


def row(rank: int, step_ms: float, peak: float | None = None) -> RankRow:
    return RankRow(rank=rank, step_ms=step_ms, peak_allocated=peak, peak_rss=None)


def test_the_slowest_and_the_largest_are_drawn_the_named_ranks_first() -> None:
    table = [row(r, 100.0 + (50 if r == 40 else r / 1000), 1000.0 + (500 if r == 9 else 0))
             for r in range(64)]
    shown = ranks_to_show(table, first=[17], current=[], limit=4)
    # the rank that must be drawn, then slowest and largest by turns
    assert shown == [17, 40, 9, 63]


def test_drawn_ranks_stay_while_they_are_still_near_the_top() -> None:
    table = [row(r, 100.0 + r * 0.01) for r in range(64)]
    # ranks 60..63 are the slowest; 58 is near the top, so it keeps its line
    assert ranks_to_show(table, [], current=[58, 0], limit=4) == [58, 63, 62, 61]
    # a rank that must be drawn takes the place of one drawn already
    assert ranks_to_show(table, [5], current=[58, 63, 62, 61], limit=4) == [5, 58, 63, 62]


@pytest.mark.parametrize("limit", [1, 16])
def test_never_more_than_the_limit_and_never_a_rank_twice(limit: int) -> None:
    table = [row(r, 100.0, 10.0) for r in range(32)]
    shown = ranks_to_show(table, [3, 3, 5], current=[5, 7], limit=limit)
    assert len(shown) == limit and len(set(shown)) == limit and shown[0] == 3
