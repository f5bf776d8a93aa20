"""The status block of ``torchlens.watch`` for a job of many ranks: the rows
worth the room (the status's ``order``), then one line for the rest."""

from __future__ import annotations

import re

from torchlens.render.ranks.watch_status import STATUS_ROWS, status_html


def status(world: int) -> dict:
    ranks = [{"rank": r, "node": r // 8, "host": f"gpu{r // 8}", "state": "running",
              "steps": 100, "step_ms": 100.0 + (40.0 if r == 37 else 0.0), "data_ms": 1.0,
              "rss": 1 << 30, "source": "rss", "slow": r == 37} for r in range(world)]
    ranks[5]["state"], ranks[5]["error"] = "failed", "ValueError: bad batch"
    return {"verdict": "rank 37 is the straggler", "ranks": ranks,
            "order": [5, 37, *range(world)], "spread": [100.0, 100.0, 140.0]}


def rows(html: str) -> list[str]:
    return re.findall(r"<tr[^>]*>\s*<td[^>]*>(\d+)</td>", html)


def test_a_big_job_shows_the_ranks_in_trouble_first_then_says_how_many_more() -> None:
    html = str(status_html("runs/x", "running", status(64)))
    shown = rows(html)
    assert len(shown) == STATUS_ROWS and shown[:3] == ["5", "37", "0"]
    assert "48 more ranks, not shown" in html
    assert "median 100.0, min 100.0, max 140.0" in html


def test_a_small_job_shows_every_rank_in_rank_order() -> None:
    html = str(status_html("runs/x", "running", status(8)))
    assert rows(html) == [str(r) for r in range(8)] and "more ranks" not in html


def test_a_garbled_order_falls_back_to_rank_order() -> None:
    st = status(40)
    st["order"], st["spread"] = ["<b>", -3, 99, None], "x"
    html = str(status_html("runs/x", "running", st))
    assert rows(html) == [str(r) for r in range(STATUS_ROWS)]
    assert "24 more ranks, not shown" in html and "median" not in html
