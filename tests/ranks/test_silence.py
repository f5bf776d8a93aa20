"""A rank that went silent and came back (``analysis.ranks.silence``), and the
live words while it is silent: a snapshot as the collector builds it."""

from __future__ import annotations

from torchlens.analysis.ranks.verdict import run_view
from torchlens.model.records import StepRecord


def _rec(step: int) -> StepRecord:
    t0 = 1000.0 + step * 0.1
    return StepRecord.from_dict({"step": step, "t0": t0, "t1": t0 + 0.05,
                                 "phases": {"data": 0.001, "forward": 0.002, "backward": 0.01,
                                            "optimizer": 0.001, "collective": 0.0},
                                 "mem": {"rss": 100 << 20, "source": "rss"}})


def _info(rank: int, **kw: object) -> dict:
    return {"rank": rank, "node": 0, "host": "h0", "silent_s": 0.3, "bye": None,
            "heartbeat": {"steps_done": 40}, "steps_sent": 40, "shared_run_dir": True, **kw}


def _snap(ranks: list, spells: list | None = None) -> dict:
    return {"world_size": len(ranks), "ranks": ranks,
            "steps": [[_rec(i) for i in range(40)] for _ in ranks],
            "summaries": [[] for _ in ranks], "spells": spells or [], "lost_after_s": 10.0}


def _spell(rank: int, **kw: object) -> dict:
    return {"rank": rank, "slot": rank, "t": 1003.7, "silent_s": 20.7, "step": 37,
            "step_after": 37, **kw}


def test_a_spell_the_others_waited_through_leads_the_verdict() -> None:
    done = {"bye": {"reason": "exit"}}
    view = run_view(_snap([_info(0, **done), _info(1, **done), _info(2, **done)],
                          [_spell(1, longest={0: 20.8, 2: 20.6})]), ended=True)
    assert [r.state for r in view.ranks] == ["finished"] * 3
    said = view.verdict
    assert said.sentence == "rank 1 went silent for 20.7 s at step 37; the others waited for it"
    assert said.code == "silent_rank" and said.ranks == (1,)
    assert "find what stopped rank 1" in said.advice
    # said once: the verdict, not again among the notes
    assert view.spells == [said.sentence] and said.sentence not in view.notes


def test_ranks_that_went_on_are_told_from_those_that_waited() -> None:
    view = run_view(_snap([_info(0), _info(1), _info(2)],
                          [_spell(2, longest={0: 21.0, 1: 0.1}, within={1: 150})]))
    assert view.verdict.sentence == ("rank 2 went silent for 20.7 s at step 37; "
                                     "rank 0 waited for it; rank 1 went on")


def test_a_failure_still_leads_and_the_spell_is_a_note() -> None:
    view = run_view(_snap([_info(0, bye={"reason": "exception", "error": "ValueError: x"}),
                           _info(1)], [_spell(1, longest={0: 20.8})]))
    assert view.verdict.sentence.startswith("rank 0 failed: ValueError: x")
    assert "rank 1 went silent for 20.7 s at step 37; the others waited for it" in view.notes


def test_a_silent_rank_whose_node_mate_waits_in_its_step_is_not_left_behind() -> None:
    """While rank 1 is stopped, rank 0 still sends heartbeats but is blocked in
    its collective in the same step: it waits for rank 1, it did not go on."""
    view = run_view(_snap([_info(0, heartbeat={"steps_done": 37}),
                           _info(1, silent_s=12.0, heartbeat={"steps_done": 37})]))
    said = str(view.verdict)
    assert "node 0 (host h0)'s other ranks wait for it: killed" in said, said
    assert "went on" not in said
    # a node-mate far ahead went on
    view = run_view(_snap([_info(0, heartbeat={"steps_done": 60}),
                           _info(1, silent_s=12.0, heartbeat={"steps_done": 37})]))
    assert "node 0 (host h0)'s other ranks went on" in str(view.verdict)


# -- while it lasts: the live words -----------------------------------------------------
# rank 0's 40 steps end at 1003.95 on its clock (``_rec``); a heartbeat's "t" is its
# rank's clock, "silent_s" its age on the collector's


def _stopped(silent_s: float, beat_t: float, steps_done: int = 30) -> dict:
    """rank 1 stopped (kill -STOP) ``silent_s`` ago; rank 0 still beats, its newest
    heartbeat sent at ``beat_t``; rank 1's last heartbeat said step ``steps_done``
    (a rank beats twice a second: at 100 steps a second it is behind)."""
    return _snap([_info(0, heartbeat={"t": beat_t, "steps_done": 40}),
                  _info(1, silent_s=silent_s, heartbeat={"t": 1003.0,
                                                         "steps_done": steps_done})])


def test_a_rank_is_silent_from_its_first_missed_heartbeat() -> None:
    # heartbeats every 0.5 s: 1.6 s without one is silent, not "running" for 10 s
    view = run_view(_stopped(1.6, 1003.95 + 1.3))
    assert [r.state for r in view.ranks] == ["running", "silent"]
    assert view.verdict.code == "silent_now" and view.verdict.ranks == (1,)
    assert view.verdict.sentence.startswith("rank 1 silent for 1.6 s (its last heartbeat in "
                                            "step 30)")
    assert "killed" not in view.verdict.sentence and "lost" not in view.verdict.sentence
    assert run_view(_stopped(0.6, 1003.95 + 0.3)).ranks[1].state == "running"


def test_while_a_rank_is_stopped_the_others_blocked_for_it_wait_not_went_on() -> None:
    # rank 0 is blocked in its collective: its heartbeats come, its steps do not
    view = run_view(_stopped(4.0, 1003.95 + 3.7))
    said = str(view.verdict)
    assert view.verdict.sentence == ("rank 1 silent for 4.0 s (its last heartbeat in step 30); "
                                     "the others wait for it: none of their steps ended since")
    assert "went on" not in said and "killed" not in said, said
    assert "a rank silent for 10 s is counted lost" in view.verdict.advice


def test_others_whose_steps_advanced_went_on() -> None:
    view = run_view(_stopped(4.0, 1004.0))  # rank 0's steps ended until its newest beat
    assert view.verdict.sentence == ("rank 1 silent for 4.0 s (its last heartbeat in step 30); "
                                     "the others went on (22 steps since)")


def test_too_soon_to_say_what_the_others_did_says_nothing_of_them() -> None:
    # rank 0's steps take 2 s: 1.2 s after the silence no step of it was due yet
    snap = _stopped(2.5, 1003.95 + 2.2)
    snap["steps"][0] = [StepRecord(step=i, t0=1000.0 + 2 * i - 2.0, t1=1000.0 + 2 * i)
                        for i in range(3)]
    snap["ranks"][0]["heartbeat"]["steps_done"] = 3
    said = run_view(snap).verdict.sentence
    assert said == "rank 1 silent for 2.5 s (its last heartbeat in step 30)", said


def test_past_the_lost_bound_the_others_still_blocked_wait_for_it() -> None:
    # rank 0's heartbeat says step 40, rank 1's last said 30: step numbers of
    # heartbeats half a second apart do not say rank 0 went on; its steps do
    view = run_view(_stopped(12.0, 1003.95 + 11.7))
    said = str(view.verdict)
    assert [r.state for r in view.ranks] == ["running", "lost"]
    assert "node 0 (host h0)'s other ranks wait for it: killed" in said, said
    assert "went on" not in said
    view = run_view(_stopped(12.0, 1003.95))  # its steps went on to its newest beat
    assert "node 0 (host h0)'s other ranks went on: killed" in str(view.verdict)


def test_before_any_step_nothing_is_said_of_the_others() -> None:
    # rank 0's first step, a loaded machine: rank 1 has no step record yet
    snap = _stopped(1.8, 1003.95 + 1.5, steps_done=0)
    snap["steps"] = [[], []]
    assert run_view(snap).verdict.sentence == "rank 1 silent for 1.8 s (its last heartbeat in step 0)"


def test_the_terminal_and_the_watch_say_the_silence() -> None:
    from torchlens.analysis.ranks.verdict import live_status
    from torchlens.render.ranks.terminal import lines, one_line
    from torchlens.render.ranks.watch_status import status_rows, status_text

    view = run_view(_stopped(4.0, 1003.95 + 3.7))
    words = "rank 1 silent for 4.0 s (its last heartbeat in step 30); the others wait for it"
    assert words in one_line(view)
    assert any(words in line for line in lines(view))
    status = live_status(view)
    assert words in status_text("runs/x", "running", status)
    assert sorted(row.cells[3] for row in status_rows(status)) == ["running", "silent"]


def test_a_peer_that_timed_out_waiting_did_not_go_on() -> None:
    # rank 0 waited for the stopped rank 1 until gloo's timeout, then failed
    snap = _stopped(25.0, 1003.95 + 21.0)
    snap["ranks"][0]["bye"] = {"reason": "exception", "error": "RuntimeError: Timed out "
                               "waiting 20000ms for recv operation to complete"}
    snap["ranks"][0]["silent_s"] = 3.0
    said = str(run_view(snap).verdict)
    assert "went on" not in said and "wait for it" not in said, said
    assert "rank 1 was lost: it stopped sending at step 30 (no goodbye: killed" in said, said


def test_steps_a_peer_made_before_the_silent_rank_really_stopped_are_not_going_on() -> None:
    # rank 1's last heartbeat came 0.5 s before it stopped; rank 0's steps in
    # that half second (steps 36-39 of _rec) are not steps it went on without it
    done = {"bye": {"reason": "exit"}}
    view = run_view(_snap([_info(0, **done), _info(1, **done)],
                          [_spell(1, t=1003.5, silent_s=20.0, within={0: 4})]), ended=True)
    assert view.verdict.sentence == "rank 1 went silent for 20.0 s at step 37", view.verdict


def test_a_peer_whose_records_are_held_back_went_on_by_its_heartbeat() -> None:
    # the collector is behind: rank 0 holds its newest records, but its
    # heartbeat says it is in step 70, 30 past the one it was in at the silence
    snap = _stopped(4.0, 1003.95 + 3.7)
    snap["ranks"][0]["heartbeat"]["steps_done"] = 70
    assert run_view(snap).verdict.sentence == (
        "rank 1 silent for 4.0 s (its last heartbeat in step 30); the others went on "
        "(30 steps since)")


def test_a_saved_silent_rank_verdict_is_a_warning_with_its_code_in_every_view() -> None:
    # the collector alone saw the spell: the folder's views must lead with it as a
    # problem (its code and rank), not as an information note
    from torchlens.analysis.ranks.collector_notes import collector_notes
    from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest

    said = ("rank 1 went silent for 12.4 s at step 49; the others waited for it; find what "
            "stopped rank 1 (kill -STOP or a job scheduler's suspend): every other rank "
            "waits for it in its next collective")
    found = collector_notes(Manifest(world_size=2, source=SOURCE_RUN, verdict=said,
                                     verdict_code="silent_rank", verdict_ranks=[1]))[0]
    assert (found.severity, found.code, found.ranks) == ("warning", "silent_rank", (1,)), found
    assert found.sentence == "rank 1 went silent for 12.4 s at step 49; the others waited for it"
    assert found.advice.startswith("find what stopped rank 1")
