"""``analysis.ranks.arrivals``: matching one step's collectives across ranks by ``seq``."""

from __future__ import annotations

import pytest

from torchlens.analysis.ranks.arrivals import collective_arrivals


def summary(*colls: tuple[int, float, int]) -> dict:
    return {"collectives": [{"name": f"allreduce{seq}", "seq": seq, "t0": t0, "dur": 0.01,
                             "lane": lane} for seq, t0, lane in colls]}


def test_the_latest_entry_of_each_seq_is_the_last_arrival() -> None:
    rows = collective_arrivals({
        0: summary((0, 10.00, 0), (1, 10.50, 1)),
        1: summary((0, 10.03, 2), (1, 10.51, 0)),
        2: summary((0, 10.01, 0)),  # seq 1 never issued on rank 2
    })
    assert [r["seq"] for r in rows] == [0, 1]
    first, second = rows
    assert first["ranks"] == [0, 1, 2] and first["lanes"] == [0, 2, 0]
    assert first["last_rank"] == 1 and first["last_t0"] == 10.03
    assert first["spread_ms"] == pytest.approx(30.0)
    assert first["name"] == "allreduce0"
    assert second["ranks"] == [0, 1] and second["last_rank"] == 1
    assert second["spread_ms"] == pytest.approx(10.0)


def test_one_rank_and_missing_fields() -> None:
    rows = collective_arrivals({3: {"collectives": [{"seq": 0, "t0": 1.0},
                                                    {"seq": None, "t0": 2.0},
                                                    {"seq": 1}]}, 4: {}})
    assert rows == [{"seq": 0, "name": "", "ranks": [3], "t0": [1.0], "lanes": [0],
                     "last_rank": 3, "last_t0": 1.0, "spread_ms": 0.0}]


def test_a_tie_goes_to_the_lower_rank_as_in_a_multi_rank_run() -> None:
    """One rule (``last_arrival``) for the live view and ``analysis.runs.collectives``."""
    rows = collective_arrivals({0: summary((0, 5.0, 0)), 1: summary((0, 5.0, 0))})
    assert rows[0]["last_rank"] == 0
