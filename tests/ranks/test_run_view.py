"""The verdict and the terminal summary of ``torchlens run`` on hand-made snapshots."""

from __future__ import annotations

import io
from statistics import median

import msgspec

from torchlens.analysis.ranks.verdict import run_view
from torchlens.model.messages import Incarnation
from torchlens.model.records import StepRecord
from torchlens.model.units import format_duration
from torchlens.render.ranks.terminal import TerminalSummary, lines, one_line


def _rec(step: int, data: float, backward: float) -> StepRecord:
    t0 = step * 0.1
    return StepRecord.from_dict({"step": step, "t0": t0, "t1": t0 + 0.05,
                                 "phases": {"data": data, "forward": 0.002, "backward": backward,
                                            "optimizer": 0.001, "collective": 0.0},
                                 "mem": {"rss": 100 << 20, "source": "rss"}})


def _snap(ranks: list, steps: list) -> dict:
    return {"world_size": len(ranks), "ranks": ranks, "steps": steps,
            "summaries": [[] for _ in ranks], "dropped": 2, "restarts": [],
            "lost_after_s": 10.0}


def _info(rank: int, node: int, **kw: object) -> dict:
    return {"rank": rank, "node": node, "host": f"h{node}", "silent_s": 0.5, "bye": None,
            "heartbeat": {"steps_done": 12}, "steps_sent": 12, "shared_run_dir": True, **kw}


def test_straggler_verdict_names_rank_part_and_ratio() -> None:
    # rank 2 loads data for 40 ms; the others wait for it inside backward
    data = {0: 0.0002, 1: 0.0003, 2: 0.040, 3: 0.0002}
    steps = [[_rec(i, data[r], 0.041 if r != 2 else 0.001) for i in range(12)] for r in range(4)]
    view = run_view(_snap([_info(r, r // 2) for r in range(4)], steps))
    others = median([0.2, 0.3, 0.2])
    said = view.verdict
    assert said.sentence.startswith("rank 2 is the slow rank: its data loading took 40.0 ms")
    assert f"{40 / others:.1f}x the others' median ({format_duration(others * 1e3)})" in said.sentence
    assert "rank 2's input pipeline" in said.advice and said.severity == "warning"
    assert [r.node for r in view.ranks] == [0, 0, 1, 1]


def test_lost_node_leads_and_groups_ranks() -> None:
    steps = [[_rec(i, 0.001, 0.01) for i in range(12)] for _ in range(4)]
    ranks = [_info(0, 0), _info(1, 0),
             _info(2, 1, silent_s=30.0, heartbeat={"steps_done": 9}),
             _info(3, 1, bye={"reason": "agent died"}, heartbeat={"steps_done": 10})]
    view = run_view(_snap(ranks, steps))
    assert [n.ranks for n in view.lost] == [[2, 3]]
    assert str(view.verdict).startswith("node 1 (host h1) was lost: ranks 2, 3 stopped sending "
                                        "at step 9")
    assert [r.state for r in view.ranks] == ["running", "running", "lost", "lost"]
    # at the end, a rank that never said goodbye is lost too
    ended = run_view(_snap([_info(0, 0), _info(1, 0, bye={"reason": "exit"})], steps[:2]),
                     ended=True)
    assert [n.ranks for n in ended.lost] == [[0]]


def test_one_killed_rank_beside_a_live_one_is_a_lost_rank_not_a_lost_node() -> None:
    """kill -9 of one worker: its node's other rank went on (and failed on the
    closed connection), so the node was not lost; the verdict names the rank."""
    steps = [[_rec(i, 0.001, 0.01) for i in range(12)] for _ in range(2)]
    ranks = [_info(0, 0, bye={"reason": "exception",
                              "error": "RuntimeError: Connection closed by peer"}),
             _info(1, 0, silent_s=30.0, heartbeat={"steps_done": 9})]
    view = run_view(_snap(ranks, steps))
    said = str(view.verdict)
    assert said.startswith("rank 1 was lost: it stopped sending at step 9"), said
    assert "node 0 (host h0)'s other ranks went on: killed (kill -9" in said, said
    assert [n.ranks for n in view.lost] == [[1]] and not view.lost[0].whole_node
    # rank 0 raised only because the killed rank went away: not the cause
    assert [r.state for r in view.ranks] == ["stopped when rank 1 went away", "lost"]


def test_terminal_redraws_in_place_on_a_tty_and_logs_lines_otherwise() -> None:
    steps = [[_rec(i, 0.001, 0.01) for i in range(12)] for _ in range(2)]
    view = run_view(_snap([_info(0, 0), _info(1, 0)], steps))
    tty = io.StringIO()
    s = TerminalSummary(tty, tty=True)
    s.draw(view)
    first = tty.getvalue()
    assert first.startswith("\x1b[Jverdict: no slow rank") and "MiB rss" in first
    s.draw(view)
    second = tty.getvalue()[len(first):]
    # up over the block, clear, the same block again
    assert second == f"\x1b[{first.count(chr(10))}F" + first
    log = io.StringIO()
    s = TerminalSummary(log, tty=False)
    s.draw(view)
    assert log.getvalue().count("\n") == 1 and "dropped 2" in log.getvalue()


def test_values_lost_to_a_full_ring_are_said_in_a_note() -> None:
    steps = [[_rec(i, 0.001, 0.01) for i in range(12)] for _ in range(2)]
    ranks = [_info(0, 0, overwritten=[0, 0]), _info(1, 0, overwritten=[3, 1])]
    view = run_view(_snap(ranks, steps))
    out = io.StringIO()
    TerminalSummary(out, tty=False).final(view, "")
    assert ("note: the collector fell behind: 3 step batch(es) and 1 summary(ies) of rank(s) 1 "
            "were overwritten") in out.getvalue()


def test_many_ranks_show_the_ones_in_trouble_first_and_sum_up_the_rest() -> None:
    # 40 ranks: rank 33 failed, rank 7 is slow; a terminal with room for 4 rows
    data = {r: 0.0002 for r in range(40)}
    data[7] = 0.040
    steps = [[_rec(i, data[r], 0.041 if r != 7 else 0.001) for i in range(12)]
             for r in range(40)]
    ranks = [_info(r, r // 8) for r in range(40)]
    ranks[33] = _info(33, 4, bye={"reason": "exception", "error": "RuntimeError: boom"})
    view = run_view(_snap(ranks, steps))
    text = "\n".join(lines(view, max_rows=4))
    rows = [line.split()[0] for line in text.splitlines()[3:7]]
    assert rows[:2] == ["33", "7"]
    assert "... 36 more ranks, not shown" in text
    assert "step ms over all ranks: median" in text
    # the log line does not list 40 ranks either
    assert "over 40 ranks" in one_line(view)


def _inc(rank: int, n: int, node: int, count: int, bye: dict | None = None,
         **kw: object) -> Incarnation:
    """One process of ``rank`` as ``Collector.incarnations`` lists it."""
    return msgspec.convert({"rank": rank, "slot": 4 * n + rank, "incarnation": n, "restart_count": count,
            "node": node, "host": f"h{node}", "world_size": 4, "t": 100.0 + 50 * n,
            "first_t": 101.0 + 50 * n, "last_t": 120.0 + 50 * n, "steps": 7,
            "steps_done": 7, "last_beat": 120.0 + 50 * n, "bye": bye, **kw}, Incarnation)


def test_a_restart_of_every_rank_is_one_restart_named_by_the_first_failure() -> None:
    from torchlens.analysis.ranks.restarts import world_restarts

    # rank 2 raised first; the others failed after it (gloo: peer closed) or were
    # ended by their agent. Node 0's agent kept restart count 0 (another node failed)
    first = [_inc(0, 0, 0, 0, {"reason": "exception", "t": 125.0, "error_t": 124.0,
                               "error": "RuntimeError: Connection closed by peer", "steps": 7}),
             _inc(1, 0, 0, 0, {"reason": "SIGTERM", "t": 125.5, "steps": 7}),
             _inc(2, 0, 1, 0, {"reason": "exception", "t": 126.0, "error_t": 121.0,
                               "error": "ValueError: bad batch", "steps": 7}),
             _inc(3, 0, 1, 0, {"reason": "SIGTERM", "t": 124.5, "steps": 7})]
    second = [_inc(r, 1, r // 2, 0 if r < 2 else 1) for r in range(4)]
    [restart] = world_restarts(first + second, 4)
    assert restart.ranks == [0, 1, 2, 3] and restart.cause_rank == 2
    assert restart.t == 126.0 and restart.resumed_t == 151.0
    assert "restarted all 4 workers at " in restart.words
    assert "after rank 2 failed at step 7 (ValueError: bad batch)" in restart.words
    assert restart.words.endswith("they were training again 25.0 s later")
    assert restart.label == "restart 1: rank 2 failed"
    # while the restart is under way; and a first start that ended without goodbyes
    [partial] = world_restarts(first + second[:1], 4)
    assert "restarted 1 of 4 workers (rank 0)" in partial.words
    silent = [_inc(r, n, 0, n, world_size=2) for n in (0, 1) for r in range(2)]
    [killed] = world_restarts(silent, 2)
    assert killed.cause == "no goodbye" and "without a goodbye" in killed.words


def test_the_terminal_says_each_restart_once_and_wraps_it_on_a_tty() -> None:
    steps = [[_rec(i, 0.001, 0.01) for i in range(12)] for _ in range(2)]
    snap = _snap([_info(0, 0), _info(1, 0)], steps)
    snap["incarnations"] = [_inc(r, n, 0, n, {"reason": "exception", "t": 125.0,
                                              "error_t": 121.0 + r, "error": "E" * 300},
                                 world_size=2)
                            for n in (0, 1) for r in (0, 1)]
    view = run_view(snap)
    tty = io.StringIO()
    TerminalSummary(tty, tty=True).draw(view)
    text = tty.getvalue()
    joined = text.replace("\n  ", " ")  # wrapped at spaces, continued with an indent
    assert joined.count("restart 1: the elastic agent restarted all 2 workers") == 1
    assert "restart 2" not in text
    assert "E" * 159 + "…" in text.replace("\n  ", "")  # wrapped, not cut
    assert all(len(line) < 200 for line in text.splitlines())


def test_the_verdict_names_the_rank_that_raised_first_not_the_lowest() -> None:
    steps = [[_rec(i, 0.001, 0.01) for i in range(5)] for _ in range(2)]
    ranks = [_info(0, 0, bye={"reason": "exception", "error_t": 12.0,
                              "error": "RuntimeError: Connection closed by peer"}),
             _info(1, 0, bye={"reason": "exception", "error_t": 11.5,
                              "error": "ValueError: bad batch"})]
    view = run_view(_snap(ranks, steps))
    assert str(view.verdict).startswith("rank 1 failed: ValueError: bad batch")


def test_a_long_run_is_drawn_bounded_and_its_slowest_steps_survive() -> None:
    from torchlens.analysis.ranks.series import MAX_POINTS, step_series
    from torchlens.formats.run_folder.manifest import RestartEntry
    from torchlens.formats.run_folder.records import CollectedSteps

    ranks = {}
    for r in range(2):  # 30,000 steps per rank: 10,000 before a restart, 20,000 after
        starts = [0] * 10_000 + [1] * 20_000
        steps = list(range(10_000)) + list(range(20_000))
        t0 = [1000.0 + 0.01 * i + (5.0 if s else 0.0) for i, s in enumerate(starts)]
        t1 = [t + 0.005 for t in t0]
        t1[12_345] += 2.0  # one 2 s step after the restart
        ranks[r] = {"restart": starts, "step": steps, "t0": t0, "t1": t1}
    series = step_series(CollectedSteps(ranks, [RestartEntry(number=1, t=1100.0,
                                                             resumed_t=1105.0, label="restart 1",
                                                             words="w")], started=1000.0))
    assert series.steps == 60_000 and series.drawn <= MAX_POINTS
    drawn = series.ranks["0"]
    assert max(drawn.ms) == 2005.0 and drawn.step[drawn.ms.index(2005.0)] == 2345
    assert set(drawn.restart) == {0, 1} and drawn.t == sorted(drawn.t)
    assert series.restarts[0].t == 100.0 and series.restarts[0].resumed == 105.0


def test_a_long_state_is_not_cut_in_the_terminal_table() -> None:
    """'ended by its a' (a new-user walk, after Ctrl-C): the column fits its longest state."""
    steps = [[_rec(i, 0.0002, 0.002) for i in range(12)] for _ in range(2)]
    ranks = [_info(0, 0), _info(1, 0, bye={"reason": "SIGTERM", "t": 1.0, "steps": 12})]
    text = "\n".join(lines(run_view(_snap(ranks, steps))))
    assert "ended by its agent" in text


def test_the_watch_says_how_steps_were_found() -> None:
    """The view says how the steps were found (here: the optimizer's
    step of a script that never calls torchlens.step())."""
    import html
    import re

    from torchlens.analysis.ranks.verdict import live_status
    from torchlens.render.ranks.watch_status import status_html

    steps = [[_rec(i, 0.0002, 0.001) for i in range(12)] for _ in range(2)]
    ranks = [_info(r, 0, heartbeat={"steps_done": 12, "steps_by": "optimizer.step() of Adam"})
             for r in range(2)]
    status = live_status(run_view(_snap(ranks, steps)))
    page = html.unescape(re.sub(r"<[^>]+>", "", str(status_html("run", "running", status))))
    assert "steps: optimizer.step() of Adam" in page


def test_the_final_verdict_wraps_on_words_at_the_terminal_width() -> None:
    """A long verdict (a failed rank's error) printed at the end of ``torchlens run``
    on an 80-column terminal: wrapped at spaces, continued with an indent, no word cut."""
    error = ("RuntimeError: the batch of shape [32, 3, 224, 224] did not match the expected "
             "input of the convolution at layer features.denseblock4.denselayer16 because "
             "somebody changed the transform pipeline")
    steps = [[_rec(i, 0.001, 0.01) for i in range(5)] for _ in range(2)]
    ranks = [_info(0, 0, bye={"reason": "exception", "error_t": 11.0, "error": error}),
             _info(1, 0)]
    out = io.StringIO()
    TerminalSummary(out, tty=False).final(run_view(_snap(ranks, steps)), width=80)
    text = out.getvalue().splitlines()
    verdict = text[:text.index(next(t for t in text if t.startswith("ranks: ")))]
    assert len(verdict) > 1 and verdict[0].startswith("verdict: rank 0 failed: RuntimeError")
    assert all(len(line) <= 80 for line in verdict)
    assert all(line.startswith("  ") and not line.startswith("   ") for line in verdict[1:])
    words = " ".join(line.strip() for line in verdict).split()
    assert "features.denseblock4.denselayer16" in words and "pipeline" in " ".join(words)


def test_a_missing_figure_in_the_terminal_table_is_written_as_the_sidebar_does() -> None:
    from torchlens.model.units import MISSING

    steps = [[_rec(i, 0.001, 0.01) for i in range(12)], []]  # rank 1: no step yet
    text = lines(run_view(_snap([_info(0, 0), _info(1, 0)], steps)))
    row = next(t for t in text if t.split()[:1] == ["1"])
    assert row.split()[-3:] == [MISSING, MISSING, MISSING], row
    assert " - " not in row


def test_the_rank_tables_footnote_wraps_on_words_at_the_terminal_width() -> None:
    """At 80 columns the footnote under the rank table ran past the edge and the
    terminal cut it mid-word ("the verdi" / "ct compares"): it wraps on spaces,
    as the verdict does, and the table's rows stay whole."""
    steps = [[_rec(i, 0.0002, 0.02) for i in range(30)],
             [_rec(i, 0.02, 0.0002) for i in range(30)]]  # rank 1 loads slowly
    out = io.StringIO()
    view = run_view(_snap([_info(0, 0), _info(1, 0)], steps))
    assert view.slow.rank == 1
    TerminalSummary(out, tty=False).final(view, width=79)  # COLUMNS=80, less one
    text = out.getvalue().splitlines()
    assert all(len(line) <= 79 for line in text), [t for t in text if len(t) > 79]
    start = next(i for i, t in enumerate(text) if t.startswith("step ms, data ms:"))
    foot = [text[start]] + [t for t in text[start + 1:] if t.startswith("  ")]
    assert len(foot) > 1 and all(t.startswith("  ") for t in foot[1:])
    said = " ".join(t.strip() for t in foot)
    assert "the steps the verdict compares" in said  # no word cut in two
    assert "the others' steps hold their wait for it" in said
    row = next(t for t in text if t.rstrip().endswith("<- slow"))
    assert row.split()[0] == "1"


def test_a_sentence_said_on_a_terminal_wraps_on_words(monkeypatch) -> None:
    """The run's last line ("torchlens run: ended with exit code 1: rank 1
    failed (...)") ran past 80 columns and was cut mid-word by the terminal."""
    import os
    import shutil

    monkeypatch.setattr(shutil, "get_terminal_size", lambda *a: os.terminal_size((80, 24)))
    said = ("torchlens run: ended with exit code 1: rank 1 failed (RuntimeError: zoo: rank 1 "
            "fails at step 40); rank 0 stopped when rank 1 went away (gloo: connection "
            "closed by peer)")
    tty = io.StringIO()
    TerminalSummary(tty, tty=True).say_words(said)
    out = tty.getvalue().splitlines()
    assert len(out) > 1 and all(len(line) <= 79 for line in out), out
    assert " ".join(line.strip() for line in out) == said
    log = io.StringIO()
    TerminalSummary(log, tty=False).say_words(said)
    assert log.getvalue() == said + "\n"  # a log keeps it one line, to grep
