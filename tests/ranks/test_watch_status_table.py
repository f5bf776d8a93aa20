"""The status block of ``torchlens.watch`` for a job of many ranks: the rows
worth the room (the status's ``order``), then one line for the rest."""

from __future__ import annotations

import re

from torchlens.analysis.ranks.verdict import LiveStatus
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
    html = str(status_html("runs/x", "running", LiveStatus.of(status(64))))
    shown = rows(html)
    assert len(shown) == STATUS_ROWS and shown[:3] == ["5", "37", "0"]
    assert "48 more ranks, not shown" in html
    assert "median 100.0, min 100.0, max 140.0" in html


def test_a_small_job_shows_every_rank_in_rank_order() -> None:
    html = str(status_html("runs/x", "running", LiveStatus.of(status(8))))
    assert rows(html) == [str(r) for r in range(8)] and "more ranks" not in html


def test_a_garbled_order_falls_back_to_rank_order() -> None:
    st = status(40)
    st["order"], st["spread"] = ["<b>", -3, 99, None], "x"
    html = str(status_html("runs/x", "running", LiveStatus.of(st)))
    assert rows(html) == [str(r) for r in range(STATUS_ROWS)]
    assert "24 more ranks, not shown" in html and "median" not in html


#: what gloo raises on the rank whose peer died (torch 2.13)
GLOO = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        "Connection closed by peer [127.0.0.1]:15797. This is typically caused by a remote "
        "worker crashing. GLHF! \U0001f3d6\ufe0f")


def test_a_rank_stopped_by_its_peer_says_so_in_the_terminals_words() -> None:
    from torchlens.render.ranks.watch_status import status_rows

    st = {"ranks": [
        {"rank": 0, "state": "failed", "error": GLOO, "steps": 150},
        {"rank": 1, "state": "failed", "error": "RuntimeError: boom on rank 1 at step 150",
         "steps": 150}]}
    cells = {row.cells[0]: row.cells[3] for row in status_rows(LiveStatus.of(st))}
    assert cells["0"] == ("failed (stopped when rank 1 went away (gloo: connection closed "
                          "by peer))"), cells
    assert cells["1"] == "failed (RuntimeError: boom on rank 1 at step 150)"
    # no rank said why: a peer
    st["ranks"][1].update(state="ended by its agent", error=None)
    cells = {row.cells[0]: row.cells[3] for row in status_rows(LiveStatus.of(st))}
    assert cells["0"] == "failed (stopped when a peer went away (gloo: connection closed by peer))"
