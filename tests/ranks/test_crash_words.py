"""How ``torchlens run`` words a crash: the rank that raised leads
with its own exception; a rank that failed only because a peer went away is
said in a few words ("rank 0 stopped when rank 1 went away (gloo: connection
closed by peer)"), never with gloo's whole message, its source path or emoji.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchlens.analysis.ranks.verdict import RankRow, RankStatus, ended_reason, run_view
from torchlens.frontends.ranks.command import _where_stopped

from .helpers import Collector, free_port, torchrun_args
from .test_run_view import _info, _rec, _snap

#: what gloo raises on the rank whose peer died (torch 2.13, the 🏖️ included)
GLOO = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        "Connection closed by peer [127.0.0.1]:37813. This is typically caused by a remote "
        "worker crashing. Check the logs of the remote worker before reporting an error. "
        "GLHF! \U0001f3d6\ufe0f")
BOOM = "RuntimeError: rank 1 boom at step 15"
NOISE = ("pair.cc", "GLHF", "\U0001f3d6", "/__w/", "typically caused")


def _clean(text: str) -> None:
    for word in NOISE:
        assert word not in text, (word, text)


def test_the_peer_is_said_in_a_few_words_after_the_rank_that_raised() -> None:
    view = SimpleNamespace(lost=[], restarts=[], ranks=[
        RankRow(rank=0, state="failed", error=GLOO, steps=15),
        RankRow(rank=1, state="failed", error=BOOM, steps=15)])
    words = _where_stopped(view, False, 1, {0: 10.0, 1: 11.0})  # rank 0's clock is earlier
    assert words == (f"ended with exit code 1: rank 1 failed ({BOOM}); rank 0 stopped when "
                     "rank 1 went away (gloo: connection closed by peer)"), words


def test_several_peers_are_one_phrase() -> None:
    view = SimpleNamespace(lost=[], restarts=[], ranks=[
        RankRow(rank=r, state="failed", error=BOOM if r == 2 else GLOO, steps=3)
        for r in range(4)])
    words = _where_stopped(view, False, 1, {})
    assert words == (f"ended with exit code 1: rank 2 failed ({BOOM}); ranks 0-1, 3 stopped "
                     "when rank 2 went away (gloo: connection closed by peer)"), words


def test_peers_alone_say_a_peer_went_away() -> None:
    view = SimpleNamespace(lost=[], restarts=[], ranks=[
        RankRow(rank=0, state="failed", error=GLOO, steps=3),
        RankRow(rank=1, state="ended by its agent", error=None, steps=3)])
    words = _where_stopped(view, False, 1, {})
    assert words == ("ended with exit code 1: rank 1 ended by its agent; rank 0 stopped when "
                     "a peer went away (gloo: connection closed by peer)"), words


def test_the_verdict_leads_with_the_rank_that_raised_even_when_the_peer_raised_earlier() -> None:
    steps = [[_rec(i, 0.001, 0.01) for i in range(5)] for _ in range(2)]
    ranks = [_info(0, 0, bye={"reason": "exception", "error_t": 11.0, "error": GLOO}),
             _info(1, 0, bye={"reason": "exception", "error_t": 11.5, "error": BOOM})]
    verdict = run_view(_snap(ranks, steps)).verdict
    assert str(verdict).startswith(f"rank 1 failed: {BOOM}")
    assert verdict.ranks == (1,)  # what a script and the page read, not the words


def test_a_verdict_with_only_the_peer_says_so_in_a_few_words() -> None:
    steps = [[_rec(i, 0.001, 0.01) for i in range(5)] for _ in range(2)]
    ranks = [_info(0, 0, bye={"reason": "exception", "error_t": 11.0, "error": GLOO}),
             _info(1, 0, bye={"reason": "SIGTERM"})]
    said = str(run_view(_snap(ranks, steps)).verdict)
    assert said.startswith("rank 0 stopped when a peer went away (gloo: connection closed by "
                           "peer)"), said
    _clean(said)


def test_only_the_rank_that_raised_reads_failed_in_the_rank_table() -> None:
    """Rank 1 raised; rank 0 raised only because rank 1 was gone: the table
    (terminal, manifest rows, watch) says rank 0 was ended by its peer's failure."""
    from torchlens.analysis.ranks.verdict import live_status
    from torchlens.render.ranks.terminal import lines

    steps = [[_rec(i, 0.001, 0.01) for i in range(5)] for _ in range(2)]
    ranks = [_info(0, 0, bye={"reason": "exception", "error_t": 11.6, "error": GLOO}),
             _info(1, 0, bye={"reason": "exception", "error_t": 11.5, "error": BOOM})]
    view = run_view(_snap(ranks, steps))
    assert [r.state for r in view.ranks] == ["stopped when rank 1 went away", "failed"]
    rows = [ln.split() for ln in lines(view) if ln.lstrip()[:1].isdigit()]
    assert [" ".join(r[3:9]) for r in rows][0] == "stopped when rank 1 went away"
    assert rows[1][3] == "failed"
    assert not any("failed" in " ".join(r) for r in rows[:1])
    status = live_status(view)
    assert [r.ended for r in status.ranks] == [
        "stopped when rank 1 went away (gloo: connection closed by peer)", f"failed: {BOOM}"]
    # with no rank that failed of its own, the one that saw its peer go still failed
    alone = [_info(0, 0, bye={"reason": "exception", "error": GLOO}), _info(1, 0)]
    assert run_view(_snap(alone, steps)).ranks[0].state == "failed"


def test_a_watch_row_says_why_its_rank_stopped_in_a_few_words() -> None:
    assert ended_reason(RankStatus(rank=0, state="failed", error=GLOO)) == (
        "failed: a peer went away (gloo: connection closed by peer)")
    assert ended_reason(RankStatus(rank=0, state="failed", error=BOOM)) == f"failed: {BOOM}"


@pytest.mark.timeout(240)
def test_a_real_two_rank_crash_names_the_rank_that_raised(tmp_path: Path) -> None:
    """Two gloo ranks; rank 1 raises at step 5, rank 0 then loses its peer."""
    out = tmp_path / "run"
    c = Collector(out, torchrun_args(1, 2, free_port()), TL_STEPS="30", TL_SLOW_S="0.0",
                  TL_FAIL_ONCE_AT="5")
    try:
        assert c.wait() == 1, c.output
    finally:
        c.kill()
    closing = [ln for ln in c.lines if ln.startswith("torchlens run: ended with exit code")]
    assert closing, c.output
    last = closing[-1]
    assert last.startswith("torchlens run: ended with exit code 1: rank 1 failed (RuntimeError: "
                           "rank 1 fails on purpose at step 5"), last
    _clean(last)
    verdict = [ln for ln in c.lines if ln.startswith("verdict: ")][-1]
    assert verdict.startswith("verdict: rank 1 failed: RuntimeError: rank 1 fails on purpose")
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["verdict_code"], manifest["verdict_ranks"]) == ("failed_rank", [1])
    _clean(manifest["stopped"])
    import torchlens

    (ended,) = [f for f in torchlens.load(str(out)).findings() if "how the run ended" in f]
    assert ended == f"how the run ended: {last.removeprefix('torchlens run: ')}", ended
    if "rank 0" in last:  # rank 0 failed on the closed connection (not ended first by its agent)
        assert "rank 0 stopped when rank 1 went away" in last, last
    # the rank table: only the rank that raised reads failed, in the manifest's rows too
    states = {r["rank"]: r["state"] for r in manifest["ranks"]}
    assert states[1] == "failed", states
    assert states[0] in ("stopped when rank 1 went away", "ended by its agent"), states


def test_a_run_folder_of_an_older_torchlens_reads_the_consequence_too() -> None:
    """A manifest that says ``ended: peer failed`` (or ``failed`` for the rank
    that only saw its peer go) reads as the rank it stopped for."""
    from torchlens.analysis.ranks.verdict import peer_failed

    assert peer_failed(["ended: peer failed", "failed"], [GLOO, BOOM], [0, 1]) == [
        "stopped when rank 1 went away", "failed"]
    assert peer_failed(["failed", "failed", "failed"], [BOOM, GLOO, GLOO], [4, 5, 6]) == [
        "failed", "stopped when rank 4 went away", "stopped when rank 4 went away"]
