"""The %ddp_check checklist says only what its evidence shows (hand-built runs).

The analysis is pure, so each case is a ``DdpRun`` as the launcher records it
for one buggy situation; the words are what a user reads.
"""

from __future__ import annotations

from torchlens.analysis.ddp.checks import checklist
from torchlens.model.collectives import Fingerprint
from torchlens.model.payloads import DdpRun, HangInfo

ENV = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "5000", "WORLD_SIZE": "2"}


def rank(r, error=None, **kw):
    return {"rank": r, "pid": 100 + r, "env_end": {**ENV, "RANK": str(r), "LOCAL_RANK": str(r)},
            "device": "cpu", "versions": {"torch": "2.13.0"}, "steps": [], "error": error,
            "comm": {"sent": r + 1, "got": 3.0, "expected": 3.0, "bandwidth": []}, **kw}


def fp(i, op, line, shape=(4,)):
    return Fingerprint(index=i, op=op, shapes=[list(shape)], dtypes=["float32"],
                       line=line, step=0, t=100.0 + i)


def items(run):
    return {i.name: i for i in checklist(run)}


def test_failures_are_listed_in_time_order_and_the_first_is_named():
    """Rank 0 died of SIGABRT (gloo, a shape mismatch) at +1 s; rank 1 raised
    later, because its peer went away. Rank 0 must come first."""
    run = DdpRun(world_size=2, backend="gloo", outcome="crashed", t0=100.0,
                 ranks=[None, rank(1, {"type": "RuntimeError", "t": 103.0, "phase": "step 0",
                                       "message": "Connection closed by peer",
                                       "traceback": "tb of rank 1"})],
                 exit_codes=[-6, 1], ended_at=[101.0, 103.5],
                 fingerprints=[[fp(0, "all_reduce", "a.py:3")],
                               [fp(0, "all_reduce", "a.py:3", (5,))]])
    item = items(run)["crashed worker"]
    assert item.status == "failed"
    assert item.evidence.startswith("rank 0 died with SIGABRT")
    assert item.evidence.index("rank 0 died") < item.evidence.index("rank 1 raised")
    assert "at +1.0 s" in item.evidence and "at +3.0 s" in item.evidence
    assert item.advice.startswith("rank 0 failed first")
    assert item.details["first"] == 0


def test_errors_are_ordered_by_their_time_not_their_rank():
    run = DdpRun(world_size=2, backend="gloo", outcome="crashed", t0=100.0,
                 ranks=[rank(0, {"type": "RuntimeError", "t": 109.0, "message": "peer gone"}),
                        rank(1, {"type": "ValueError", "t": 102.0, "message": "bad batch"})],
                 exit_codes=[1, 1], ended_at=[109.1, 102.1], fingerprints=[[], []])
    item = items(run)["crashed worker"]
    assert item.evidence.startswith("rank 1 raised ValueError: bad batch")
    assert item.advice.startswith("rank 1 failed first")


def test_a_rank_its_launcher_stopped_is_not_named_first():
    """The agent SIGTERMs the survivors when a rank is SIGKILLed; a rank found
    gone is timed by its last heartbeat, so a stopped rank can look earlier."""
    run = DdpRun(world_size=3, backend="gloo", outcome="crashed", t0=100.0,
                 ranks=[None, None, rank(2, {"type": "RuntimeError", "t": 107.1,
                                              "message": "Connection reset by peer"})],
                 exit_codes=[-15, -9, 1], ended_at=[106.9, 107.0, 107.2],
                 fingerprints=[[], [], []])
    item = items(run)["crashed worker"]
    assert item.evidence.startswith("rank 1 died with SIGKILL at +7.0 s"), item.evidence
    assert item.evidence.endswith("rank 0 was stopped by its launcher with SIGTERM at +6.9 s")
    assert item.advice.startswith("rank 1 failed first")
    # a SIGTERM that is the only kind of failure is the cause: ordered by time
    alone = DdpRun(world_size=2, backend="gloo", outcome="crashed", t0=100.0,
                   ranks=[None, None], exit_codes=[-15, -15], ended_at=[103.0, 101.0],
                   fingerprints=[[], []])
    item = items(alone)["crashed worker"]
    assert item.evidence.startswith("rank 1 died with SIGTERM at +1.0 s"), item.evidence


def test_without_times_no_rank_is_said_to_have_failed_first():
    """An old file: no times recorded, so no order can be claimed."""
    run = DdpRun(world_size=2, backend="gloo", outcome="crashed",
                 ranks=[rank(0, {"type": "RuntimeError", "message": "peer gone"}), None],
                 exit_codes=[1, -6], fingerprints=[[], []])
    item = items(run)["crashed worker"]
    assert item.status == "failed"
    assert "rank 0 failed first" not in item.advice and "rank 1 failed first" not in item.advice
    assert "which rank failed first is not known" in item.advice
    assert item.details["first"] is None


def test_environment_is_not_passed_when_a_rank_did_not_report():
    run = DdpRun(world_size=2, backend="gloo", outcome="crashed", t0=100.0,
                 ranks=[rank(0), None], exit_codes=[0, -6], ended_at=[102.0, 101.0],
                 fingerprints=[[], []])
    item = items(run)["environment"]
    assert item.status == "not applicable"
    assert item.evidence.startswith("only 1 of 2 ranks reported (rank 1 died before reporting)")
    assert item.advice == "see the crashed-worker line"
    assert items(run)["crashed worker"].status == "failed"


def test_environment_problem_among_the_reporting_ranks_still_fails():
    bad = rank(0)
    bad["env_end"] = {**bad["env_end"], "WORLD_SIZE": "4"}
    run = DdpRun(world_size=2, backend="gloo", outcome="crashed", ranks=[bad, None],
                 exit_codes=[0, -6], fingerprints=[[], []])
    assert items(run)["environment"].status == "failed"


def test_a_hang_points_to_the_hang_not_to_a_crash_that_did_not_happen():
    stacks = ["", 'Thread 0x1 (most recent call first):\n'
                  '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
                  '  File "/home/u/train.py", line 12 in load_batch\n'
                  '  File "/home/u/train.py", line 30 in step\n']
    hang = {"after_s": 3.2, "stacks": stacks, "status": [
        {"phase": "step 0", "collectives": 1, "in_collective": False,
         "last": {"index": 0, "op": "all_reduce", "line": "/home/u/train.py:31"}},
        {"phase": "step 0", "collectives": 0, "in_collective": False, "last": None}]}
    run = DdpRun(world_size=2, backend="gloo", outcome="hang", ranks=[None, None],
                 exit_codes=[None, None], killed=[0, 1], hang=HangInfo(**hang),
                 fingerprints=[[fp(0, "all_reduce", "/home/u/train.py:31")], []])
    got = items(run)
    for name in ("environment", "communication"):
        assert got[name].status == "not applicable"
        assert got[name].advice == "see the hang line", got[name]
        assert "stopped by the hang detector" in got[name].evidence
    assert got["crashed worker"].status == "passed"
    assert "before the hang detector stopped them" in got["crashed worker"].evidence
    h = got["hang"]
    assert "rank 1 has issued no collective (phase step 0), now at /home/u/train.py:12 " \
           "in load_batch" in h.evidence
    assert h.advice.startswith("rank 1 never reached the collective that rank 0 wait")
    assert h.details["behind"] == [1]


def test_a_plain_op_mismatch_says_the_ops_differ_not_that_a_rank_skipped():
    """op_mismatch under --strict: rank 1's broadcast is on a later line (its
    else branch), which is no evidence that it skipped anything."""
    run = DdpRun(world_size=2, backend="gloo", outcome="mismatch",
                 ranks=[rank(0), rank(1)], exit_codes=[1, 1],
                 fingerprints=[[fp(0, "all_reduce", "a.py:7")], [fp(0, "broadcast", "a.py:9")]])
    item = items(run)["collective sequence"]
    assert item.status == "failed"
    assert item.evidence.startswith("first divergence at collective #0 (the ranks issued "
                                    "different ops): rank 0: #0 all_reduce float32[4] at a.py:7; "
                                    "rank 1: #0 broadcast float32[4] at a.py:9")
    assert "skip" not in item.evidence and item.details["skipped"] == []


def test_a_skip_is_named_when_the_next_collectives_show_it():
    run = DdpRun(world_size=2, backend="gloo", outcome="mismatch",
                 ranks=[rank(0), rank(1)], exit_codes=[1, 1],
                 fingerprints=[[fp(0, "all_reduce", "a.py:4"), fp(1, "all_reduce", "a.py:5")],
                               [fp(0, "all_reduce", "a.py:5"), fp(1, "broadcast", "a.py:6")]])
    item = items(run)["collective sequence"]
    assert item.details["index"] == 1 and item.details["skipped"] == [1]
    assert ("rank 1 skipped a collective: it never issued rank 0's #0 all_reduce float32[4] "
            "at a.py:4; its own #0 is rank 0's #1 (same op and tensors, same line)") in item.evidence


def test_one_loop_iteration_fewer_is_not_a_skip():
    same = [fp(i, "all_reduce", "a.py:5") for i in range(3)]
    run = DdpRun(world_size=2, backend="gloo", outcome="finished", ranks=[rank(0), rank(1)],
                 exit_codes=[0, 0], fingerprints=[same, same[:2]])
    item = items(run)["collective sequence"]
    assert item.details["skipped"] == [] and item.details["missing"] == [1]
    assert "ranks issued different numbers of collectives" in item.evidence
    assert "skip" not in item.evidence


def test_an_oom_line_says_where_the_snapshot_is_or_why_there_is_none():
    """Rank 0 saved its allocator snapshot; rank 1 ran cudaMallocAsync, which
    torch cannot snapshot: the user is told both, and what to open."""
    from torchlens.analysis.ddp.checks import summary
    from torchlens.render.findings import finding_text

    oom = {"type": "OutOfMemoryError", "t": 101.0, "message": "CUDA out of memory"}
    why = ("PYTORCH_CUDA_ALLOC_CONF has backend:cudaMallocAsync, which keeps no per-block "
           "state: torch cannot snapshot it (the OOM message is what there is)")
    run = DdpRun(world_size=2, backend="nccl", outcome="crashed", t0=100.0,
                 ranks=[rank(0, oom, oom_snapshot={"path": "/runs/r/rank0/oom.pickle",
                                                   "why": None}),
                        rank(1, oom, oom_snapshot={"path": None, "why": why})],
                 exit_codes=[1, 1], ended_at=[101.1, 101.2], fingerprints=[[], []])
    checks = items(run)
    item = checks["out of memory"]
    assert item.evidence == (
        "rank 0 ran out of CUDA memory; its allocator snapshot is in /runs/r/rank0/oom.pickle; "
        f"rank 1 ran out of CUDA memory; no allocator snapshot was saved: {why}")
    assert item.advice.startswith("%gpumem --load /runs/r/rank0/oom.pickle")
    assert item.status == "info"  # the crashed-worker line is the failure
    assert checks["crashed worker"].status == "failed"
    assert summary(list(checks.values()), run).endswith("1 failed: crashed worker")
    assert "no allocator snapshot was saved: PYTORCH_CUDA_ALLOC_CONF" in finding_text(item)


def test_no_oom_no_oom_line():
    run = DdpRun(world_size=1, backend="gloo", outcome="finished", ranks=[rank(0)],
                 exit_codes=[0], fingerprints=[[]])
    assert "out of memory" not in items(run)


def test_a_small_pools_fragmentation_is_said_in_bytes_not_an_alarming_share() -> None:
    """'fragmentation 97%' of a tiny model's 2 MiB pool alarmed for 1.9 MiB."""
    from torchlens.analysis.ddp.profiled import _rank_memory_words

    mib = 1024 * 1024
    row = {"rank": 0, "source": "modelled", "allocated": 11 * 1024, "peak_allocated": 13 * 1024,
           "reserved": 2 * mib, "peak_reserved": 2 * mib, "inactive_split": 2 * mib - 60 * 1024,
           "frag": (2 * mib - 60 * 1024) / (2 * mib), "largest_free": None, "rss": None}
    words = _rank_memory_words(row)
    assert "%" not in words and "of the 2.0 MiB pool free in split blocks" in words
    big = dict(row, reserved=4096 * mib, inactive_split=1024 * mib, frag=0.25)
    assert "(fragmentation 25" in _rank_memory_words(big)
