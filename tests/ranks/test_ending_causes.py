"""How a run that ended early is named when one rank's loop, not its code,
ended it: a rank that finished while its peers were still training (uneven
inputs), and ranks whose collectives did not match (gloo aborts the rank that
received the wrong size; torchrun reports it killed by SIGABRT)."""

from __future__ import annotations

from torchlens.analysis.ranks.crash import error_words, left_early
from torchlens.analysis.ranks.job_exit import job_ended, mismatch_said
from torchlens.analysis.ranks.verdict import RankRow, run_view
from torchlens.frontends.ranks.command import _where_stopped

from .test_crash_words import BOOM, GLOO
from .test_run_view import _info, _rec, _snap

#: what torch 2.13's gloo wrote when rank 1 all-reduced 3 values against rank 0's 5
#: (C++ std::terminate: on stderr, no rank prefix), then torchrun's failure report
MISMATCH_OUTPUT = [
    "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
    "  what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4. Received data size doesn't match "
    "expected size. Is there a distributed collective mismatch in your code?",
    f"[rank0]: {GLOO}",
    "Failures:", "[1]:", "  rank      : 0 (local_rank: 0)",
    "  exitcode  : -15 (pid: 5461)  (SIGTERM)",
    "Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
    "  exitcode  : -6 (pid: 5462)  (SIGABRT)",
]


def _uneven_view() -> object:
    # rank 1 ran out of batches after 50 steps and said goodbye; rank 0 was in its
    # next all-reduce when rank 1's connection closed
    steps = [[_rec(i, 0.001, 0.01) for i in range(50)] for _ in range(2)]
    ranks = [_info(0, 0, steps_sent=50, bye={"reason": "exception", "error_t": 11.0,
                                              "error": GLOO}),
             _info(1, 0, steps_sent=50, bye={"reason": "exit"})]
    return run_view(_snap(ranks, steps), ended=True)


def test_a_rank_that_finished_while_its_peer_trained_is_named_as_uneven_inputs() -> None:
    verdict = _uneven_view().verdict
    assert verdict.code == "uneven_inputs" and verdict.ranks == (1,), verdict
    assert verdict.sentence.startswith("uneven inputs: rank 1 finished after 50 steps while "
                                       "rank 0 was still training"), verdict.sentence
    assert "join()" in verdict.advice and "drop_last" in verdict.advice
    assert "GLHF" not in str(verdict)


def test_the_run_s_last_line_names_the_rank_that_left() -> None:
    view = _uneven_view()
    words = _where_stopped(view, False, 1, {})
    assert words == ("ended with exit code 1: rank 0 stopped when rank 1 went away "
                     "(gloo: connection closed by peer)"), words
    assert error_words(view.ranks)[0] == ("stopped when rank 1 went away (gloo: connection "
                                          "closed by peer)")


def test_a_rank_that_raised_its_own_error_is_the_cause_not_the_one_that_finished() -> None:
    rows = [RankRow(rank=0, state="failed", error=GLOO, steps=20),
            RankRow(rank=1, state="failed", error=BOOM, steps=20),
            RankRow(rank=2, state="finished", steps=20)]
    assert left_early(rows, {0: 20, 1: 20, 2: 20}) == []
    # a rank that finished after more steps than the failed one did not leave early
    rows = [RankRow(rank=0, state="failed", error=GLOO, steps=20),
            RankRow(rank=1, state="finished", steps=80)]
    assert left_early(rows, {0: 20, 1: 80}) == []


def test_a_healthy_end_is_not_uneven() -> None:
    steps = [[_rec(i, 0.001, 0.01) for i in range(30)] for _ in range(2)]
    ranks = [_info(r, 0, steps_sent=30, bye={"reason": "exit"}) for r in range(2)]
    assert run_view(_snap(ranks, steps), ended=True).verdict.code != "uneven_inputs"


def _mismatch_view() -> object:
    # rank 1 died in native code before sending a step; rank 0 then lost its peer
    steps = [[_rec(i, 0.001, 0.01) for i in range(51)], []]
    ranks = [_info(0, 0, steps_sent=51, bye={"reason": "exception", "error_t": 11.0,
                                              "error": GLOO}),
             _info(1, 0, steps_sent=0, heartbeat={"steps_done": 0})]
    return run_view(_snap(ranks, steps), ended=True)


def test_a_collective_mismatch_names_the_rank_that_aborted_and_gloo_s_words() -> None:
    before = _mismatch_view()
    assert before.verdict.code == "lost_node"  # all the collector alone can tell
    view = job_ended(before, 1, MISMATCH_OUTPUT)
    verdict = view.verdict
    assert verdict.code == "collective_mismatch" and verdict.ranks == (1,), verdict
    assert "rank 1 was killed by signal 6 (SIGABRT)" in verdict.sentence, verdict.sentence
    assert "rank 0 was killed" not in verdict.sentence  # torchrun's SIGTERM: a consequence
    assert "Received data size doesn't match expected size" in verdict.sentence
    assert "pair.cc" not in verdict.sentence and "same shapes" in verdict.advice
    assert [r.state for r in view.ranks][1] == "killed by signal 6 (SIGABRT)"
    # the lost rank is not guessed "killed (kill -9, the OOM killer) or hung"
    assert "OOM killer) or hung" not in view.lost[0].words, view.lost[0].words
    assert "killed by signal 6 (SIGABRT)" in view.lost[0].words
    # its unsent records died with it: its step count is said to be what arrived
    assert any(n.startswith("rank 1 was killed by signal 6 (SIGABRT): the steps it had not "
                            "sent yet died with it") for n in view.notes), view.notes


def test_a_rank_killed_by_a_signal_is_said_so_without_a_mismatch() -> None:
    report = [line for line in MISMATCH_OUTPUT if "what()" not in line]
    view = job_ended(_mismatch_view(), 1, report)
    assert view.verdict.code == "lost_node" and view.verdict.ranks == (1,)
    assert view.verdict.sentence == ("rank 1 was lost: it was killed by signal 6 (SIGABRT) "
                                     "(torchrun's report), with no goodbye"), view.verdict
    assert "SIGABRT: a fatal error in native code" in view.verdict.advice


def test_only_a_line_that_says_so_is_a_mismatch() -> None:
    assert mismatch_said([GLOO, "exitcode  : -6"]) is None
    said = mismatch_said(MISMATCH_OUTPUT)
    assert said is not None and said.startswith("Received data size doesn't match"), said


def test_the_manifest_gives_the_cause_back_to_the_report() -> None:
    from torchlens.analysis.ranks.collector_notes import failure_finding
    from torchlens.formats.run_folder.manifest import SOURCE_RUN, Manifest

    verdict = job_ended(_mismatch_view(), 1, MISMATCH_OUTPUT).verdict
    manifest = Manifest(world_size=2, source=SOURCE_RUN, verdict=str(verdict), verdict_code=verdict.code,
                        verdict_ranks=list(verdict.ranks))
    found = failure_finding(manifest)
    assert found is not None and found.code == "collective_mismatch", found
    assert found.ranks == (1,) and found.title == "collective mismatch"
    assert found.advice == verdict.advice, found
    uneven = _uneven_view().verdict
    found = failure_finding(Manifest(world_size=2, source=SOURCE_RUN, verdict=str(uneven),
                                     verdict_code=uneven.code, verdict_ranks=[1]))
    assert found is not None and (found.code, found.title) == ("uneven_inputs", "uneven inputs")
    assert found.advice == uneven.advice



def test_states_from_torchrun_s_exit_codes_read_as_ended_everywhere() -> None:
    from torchlens.analysis.ranks.metrics import prometheus_state
    from torchlens.analysis.ranks.verdict import RankStatus, ended_reason, has_ended

    # a rank killed without a goodbye is lost to Prometheus, as before torchrun's
    # report named its signal; its agent's SIGTERM only ended it; an exit code failed
    assert prometheus_state("killed by signal 9 (SIGKILL)") == "lost"
    assert prometheus_state("killed by signal 6 (SIGABRT)") == "lost"
    assert prometheus_state("killed by signal 15 (SIGTERM)") == "ended"
    assert prometheus_state("exit code 2") == "failed"
    assert prometheus_state("lost") == "lost" and prometheus_state("running") == "up"
    assert has_ended("killed by signal 6 (SIGABRT)") and not has_ended("running")
    assert ended_reason(RankStatus(rank=1, state="exit code 2")) == "exit code 2"


#: what a gloo job that never called destroy_process_group printed when rank 0
#: aborted at interpreter exit (torch 2.13, the Hugging Face Trainer), then torchrun
EXIT_ABORT_OUTPUT = [
    "{'train_runtime': '1.583', 'train_loss': '5.574', 'epoch': '0.02344'}",
    "terminate called without an active exception",
    "W1207 05:15:01.314000 14756 torch/distributed/elastic/multiprocessing/api.py:1028] "
    "Sending process 14762 closing signal SIGTERM",
    "E1207 05:15:01.346000 14756 torch/distributed/elastic/multiprocessing/api.py:1002] "
    "failed (exitcode: -6) local_rank: 0 (pid: 14761) of binary: python",
    "Failures:", "[1]:", "  rank      : 1 (local_rank: 1)",
    "  exitcode  : -15 (pid: 14762)  (SIGTERM)",
    "Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)",
    "  exitcode  : -6 (pid: 14761)  (SIGABRT)",
]


def _ended_view(byes: list[dict | None], steps_sent: list[int]) -> object:
    steps = [[_rec(i, 0.001, 0.01) for i in range(n)] for n in steps_sent]
    ranks = [_info(r, 0, steps_sent=n, bye=bye, heartbeat={"steps_done": n})
             for r, (bye, n) in enumerate(zip(byes, steps_sent, strict=True))]
    return run_view(_snap(ranks, steps), ended=True)


def test_an_abort_at_exit_after_every_step_is_named_with_its_cure() -> None:
    # both ranks trained their 6 steps and said goodbye; rank 0 then aborted in
    # the interpreter's teardown and torchrun SIGTERMed rank 1
    view = job_ended(_ended_view([{"reason": "exit"}] * 2, [6, 6]), 1, EXIT_ABORT_OUTPUT)
    verdict = view.verdict
    assert verdict.code == "exit_abort" and verdict.ranks == (0,), verdict
    assert verdict.sentence.startswith("the job failed as it exited, after its last step: "
                                       "rank 0 aborted (signal 6, SIGABRT)"), verdict.sentence
    assert "destroy_process_group()" in verdict.advice, verdict.advice
    # its goodbye came first: its records are whole, not "those that arrived"
    assert not any("died with it" in n for n in view.notes), view.notes
    assert [r.state for r in view.ranks][0] == "killed by signal 6 (SIGABRT)"


def test_an_abort_before_the_end_is_not_called_an_exit_abort() -> None:
    # rank 0 aborted mid-run (no goodbye, 3 of 6 steps): the job failed, no cure guessed
    view = job_ended(_ended_view([None, {"reason": "exit"}], [3, 6]), 1, EXIT_ABORT_OUTPUT)
    assert view.verdict.code != "exit_abort", view.verdict
    assert any("died with it" in n for n in view.notes), view.notes
    # the SIGTERMed peer had fewer steps than the rank that said goodbye: not ended
    view = job_ended(_ended_view([{"reason": "exit"}, None], [6, 4]), 1, EXIT_ABORT_OUTPUT)
    assert view.verdict.code != "exit_abort", view.verdict
