"""A rank's memory creep against a weak slow rank (a walk planted a 4 MiB a
step leak, no slow rank, and was told first of a slow rank whose others
waited 1.2 ms of a 15.3 ms step; the run report never named the creep)."""

from __future__ import annotations

import dataclasses

from torchlens.analysis.ranks.slow import slow_rank_finding, weak
from torchlens.analysis.ranks.steps import MemoryCreep
from torchlens.analysis.ranks.verdict import creep_finding, run_view
from torchlens.analysis.runs.verdict import leading_findings
from torchlens.formats.run_folder.manifest import SOURCE_RUN, CreepEntry, Manifest
from torchlens.model.findings import Figure
from torchlens.model.records import StepRecord

MIB = 1 << 20


def _rec(rank: int, i: int) -> StepRecord:
    """15 ms steps; rank 1 loads data 3 ms, 1.2 ms of which the others wait
    for in backward; rank 0 keeps 4 MiB more every step."""
    t0 = i * 0.1
    data, backward = (0.003, 0.0008) if rank == 1 else (0.00024, 0.002)
    return StepRecord.from_dict({
        "step": i, "t0": t0, "t1": t0 + 0.0153,
        "phases": {"data": data, "forward": 0.004, "backward": backward, "optimizer": 0.001,
                   "collective": 0.0},
        "mem": {"rss": (300 + (4 * i if rank == 0 else 0)) * MIB, "source": "rss"}})


def _snap() -> dict:
    ranks = [{"rank": r, "node": 0, "host": "h0", "silent_s": 0.5, "bye": None,
              "heartbeat": {"steps_done": 30}, "steps_sent": 30, "shared_run_dir": True}
             for r in range(2)]
    return {"world_size": 2, "ranks": ranks, "steps": [[_rec(r, i) for i in range(30)]
                                                        for r in range(2)],
            "summaries": [[], []], "dropped": 0, "restarts": [], "lost_after_s": 10.0}


def test_the_terminal_leads_with_the_creep_over_a_weak_slow_rank() -> None:
    view = run_view(_snap())
    assert view.slow.rank == 1 and weak(view.slow.finding)  # found, but weak
    assert view.creep and view.creep[0].rank == 0
    assert view.verdict.sentence.startswith("rank 0's memory creeps: +4.0 MiB per step")


def test_a_strong_slow_rank_keeps_the_lead() -> None:
    unexplained = slow_rank_finding(1, None, "the others waited 30 ms per step", (
        Figure("wait_per_step_ms", 30.0, "ms"), Figure("median_step_ms", 60.0, "ms")))
    assert weak(unexplained)  # no measured part explains it: weak whatever the wait
    from torchlens.analysis.ranks.slow import PartTime

    explained = slow_rank_finding(1, PartTime("data", 40.0, 10.0, 30.0),
                                  "the others waited 30 ms per step", (
                                      Figure("wait_per_step_ms", 30.0, "ms"),
                                      Figure("median_step_ms", 60.0, "ms")))
    assert not weak(explained)


def test_the_run_report_names_the_creep_and_orders_it_the_same_way() -> None:
    view = run_view(_snap())
    creep = view.creep[0]
    manifest = Manifest(world_size=2, source=SOURCE_RUN, verdict=str(view.verdict),
                        verdict_code=view.verdict.code,
                        memory_creep=[CreepEntry(**dataclasses.asdict(creep))])
    findings = leading_findings(view.slow, manifest, [], "")
    assert [f.code for f in findings] == ["memory_creep", "slow_rank"]
    assert [f.sentence.split(":")[0] for f in findings] == [
        "rank 0's memory creeps", "rank 1 is the slow rank"]
    assert findings[0].sentence == creep_finding(creep).sentence
    # said once, not again as the collector's words (nor, in an older
    # manifest without the verdict's code, by its words)
    older = Manifest(world_size=2, source=SOURCE_RUN, verdict=str(view.verdict),
                     memory_creep=[CreepEntry(**dataclasses.asdict(creep))])
    assert [f.code for f in leading_findings(view.slow, older, [], "")] == [
        "memory_creep", "slow_rank"]
    # without a slow rank the creep is still there
    alone = leading_findings(None, manifest, [], "")
    assert alone[0].sentence == creep_finding(creep).sentence
    assert isinstance(MemoryCreep(**dataclasses.asdict(creep)), MemoryCreep)


def test_no_slow_rank_never_leads_a_creep_in_the_report() -> None:
    """A leak on every rank and even step times: the report's first finding is
    the creep, not a green "no slow rank" above it (the terminal's order)."""
    from torchlens.model.findings import PASSED

    view = run_view(_snap())
    creep = view.creep[0]
    none = dataclasses.replace(view.slow, rank=None, finding=dataclasses.replace(
        view.slow.finding, severity=PASSED, sentence="no slow rank: step times within 1%"))
    manifest = Manifest(world_size=2, source=SOURCE_RUN, verdict=str(view.verdict),
                        verdict_code="memory_creep",
                        memory_creep=[CreepEntry(**dataclasses.asdict(creep))])
    assert [f.code for f in leading_findings(none, manifest, [], "")] == [
        "memory_creep", "slow_rank"]


def test_a_creep_leads_the_slow_rank_when_that_rank_is_the_one_that_leaks() -> None:
    """A leaking rank is slower (fresh pages for its allocations every step): the
    others wait for it, but its creep is what ends the run, so it leads."""
    from torchlens.analysis.ranks.slow import PartTime
    from torchlens.analysis.runs.verdict import verdict_findings

    slow = slow_rank_finding(1, PartTime("compute", 23.5, 13.9, 9.6),
                             "the others waited 10.6 ms per step for it", (
                                 Figure("wait_per_step_ms", 10.6, "ms"),
                                 Figure("median_step_ms", 18.0, "ms")))
    assert not weak(slow)
    creep = creep_finding(MemoryCreep(1, 1 << 20, 51 << 20, 51, "heap", ""))
    judged = dataclasses.replace(run_view(_snap()).slow, rank=1, finding=slow)
    manifest = Manifest(world_size=2, source=SOURCE_RUN, verdict=str(creep), memory_creep=[CreepEntry(
        rank=1, bytes_per_step=1 << 20, total_bytes=51 << 20, steps=51, source="heap",
        words="")])
    assert [f.code for f in verdict_findings(judged, manifest)] == ["memory_creep", "slow_rank"]


def test_a_rank_slow_at_loading_data_keeps_the_lead_over_its_own_creep() -> None:
    """A leak does not make data loading slow: the slow rank and its cause lead
    in every view, the creep follows."""
    from torchlens.analysis.ranks.slow import PartTime, creep_leads
    from torchlens.analysis.runs.verdict import verdict_findings

    slow = slow_rank_finding(1, PartTime("data", 60.6, 0.2, 60.4),
                             "the others waited 58 ms per step for it", (
                                 Figure("wait_per_step_ms", 58.0, "ms"),
                                 Figure("median_step_ms", 88.0, "ms")))
    assert not creep_leads(slow, [1]) and not creep_leads(slow, [0])
    judged = dataclasses.replace(run_view(_snap()).slow, rank=1, finding=slow)
    manifest = Manifest(world_size=2, source=SOURCE_RUN, verdict=str(slow), memory_creep=[CreepEntry(
        rank=1, bytes_per_step=1 << 20, total_bytes=51 << 20, steps=51, source="heap",
        words="")])
    assert [f.code for f in verdict_findings(judged, manifest)] == ["slow_rank", "memory_creep"]


def test_a_leak_kept_between_phases_leads_the_stall_it_makes() -> None:
    """Keeping 1 MiB a step in user code between the phases (a cache filled after
    the optimizer step) reads as time outside every phase on that rank: the
    creep is the cause and leads."""
    from torchlens.analysis.ranks.slow import PartTime, creep_leads

    stall = slow_rank_finding(1, PartTime("stall", 4.0, 0.5, 3.5),
                              "the others waited 3.3 ms per step for it", (
                                  Figure("wait_per_step_ms", 3.3, "ms"),
                                  Figure("median_step_ms", 14.0, "ms")))
    assert creep_leads(stall, [1]) and not creep_leads(stall, [0])


def test_a_leak_leads_a_rank_that_waits_a_little_more_on_a_machine_busy_for_all() -> None:
    """Every rank waits ~40 ms a step for a CPU (an oversubscribed machine) and
    rank 1 1.3x that: a leak on every rank leads; a rank alone on a busy core
    (15x the others' wait) keeps the lead."""
    from torchlens.analysis.ranks.slow import PartTime, creep_leads

    shared = slow_rank_finding(1, PartTime("cpu_contention", 54.5, 42.5, 12.0),
                               "the others waited 23.6 ms per step for it", (
                                   Figure("wait_per_step_ms", 23.6, "ms"),
                                   Figure("median_step_ms", 100.9, "ms")))
    assert creep_leads(shared, [0, 1])
    alone = slow_rank_finding(1, PartTime("cpu_contention", 30.0, 2.0, 28.0),
                              "the others waited 26 ms per step for it", (
                                  Figure("wait_per_step_ms", 26.0, "ms"),
                                  Figure("median_step_ms", 60.0, "ms")))
    assert not creep_leads(alone, [0, 1])


def test_a_leak_leads_a_compute_slow_rank_on_another_rank() -> None:
    """The ranks that free what a leaking rank keeps allocate anew every step:
    the zoo's leak_losses_one named its non-leaking rank 0 slow for its forward
    and optimizer (22 ms a step on a CPU against 18 ms) ahead of rank 1's leak."""
    from torchlens.analysis.ranks.slow import PartTime, creep_leads

    compute = slow_rank_finding(0, PartTime("compute", 15.8, 10.4, 5.4),
                                "the others waited 5.3 ms per step for it", (
                                    Figure("wait_per_step_ms", 5.3, "ms"),
                                    Figure("median_step_ms", 32.0, "ms")))
    assert creep_leads(compute, [1]) and creep_leads(compute, [0])
    data = slow_rank_finding(0, PartTime("data", 40.0, 10.0, 30.0),
                             "the others waited 30 ms per step for it", (
                                 Figure("wait_per_step_ms", 30.0, "ms"),
                                 Figure("median_step_ms", 60.0, "ms")))
    assert not creep_leads(data, [1])  # a slow input pipeline is no leak's doing
