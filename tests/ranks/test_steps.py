"""The slow rank, its cause and memory creep, from step records shaped like a
profiled DDP run's (docs/RANK_PROFILE.md).

``simulate`` plays a DDP step on every rank with shared clocks: each rank loads
data, runs forward and its backward compute, and DDP's gradient all_reduce ends
when the last rank arrives, so the others' ``backward`` holds the wait, as on
real ranks. The assertions are what a user reads: the rank named, the cause,
the figures in the words.
"""

from __future__ import annotations

import random
import time

import pytest

from torchlens.analysis.ddp.checks import checklist, summary
from torchlens.analysis.ranks.slow import slow_rank
from torchlens.analysis.ranks.steps import memory_creep, rank_table, step_rows
from torchlens.model.payloads import DdpRun, RankProfiling
from torchlens.model.records import StepMemory, StepRecord

MiB = 1 << 20
BASE = {"data": 0.010, "forward": 0.012, "bwd": 0.020, "optimizer": 0.002, "other": 0.003}
ALLREDUCE = 0.004


def _mem(r, s, cuda, alloc, rss):
    grow = alloc.get(r, 0) * s
    if not cuda:
        return StepMemory(rss=400 * MiB + rss.get(r, 0) * s, source="rss")
    return StepMemory(rss=900 * MiB, allocated=100 * MiB + grow, reserved=160 * MiB + grow,
                      inactive_split=8 * MiB, source="cuda")


def simulate(ranks=4, n=40, extra=None, noise=0.0, seed=0, backward=True, cuda=True,
             alloc=None, rss=None, modelled=None, every=5):
    """(steps, summaries) of ``ranks`` ranks for ``n`` steps.

    ``extra[r]``: seconds added to rank r's ``data``, ``forward``, ``bwd``
    (backward compute), ``optimizer``, ``other`` or ``gather`` (a collective of
    its own before backward). ``backward=False``: an explicit all_reduce loop,
    compute unmeasured (``other``) and the wait in ``collective``. ``alloc`` /
    ``rss`` / ``modelled``: bytes per step each rank's memory grows by.
    """
    rng = random.Random(seed)
    extra, alloc, rss, modelled = extra or {}, alloc or {}, rss or {}, modelled or {}
    clock = [1790857026.0] * ranks
    steps = [[] for _ in range(ranks)]
    summaries = [[] for _ in range(ranks)]
    for s in range(n):
        part = [{k: max(0.0, v + extra.get(r, {}).get(k, 0.0) + rng.gauss(0, noise))
                 for k, v in {**BASE, "gather": 0.0}.items()} for r in range(ranks)]
        if backward:
            reach = [clock[r] + p["data"] + p["forward"] + p["gather"] for r, p in enumerate(part)]
            arrive = [reach[r] + part[r]["bwd"] for r in range(ranks)]
        else:  # forward/backward/optimizer are the user's own, untimed code
            reach = [clock[r] + p["data"] + p["forward"] + p["bwd"] + p["optimizer"]
                     for r, p in enumerate(part)]
            arrive = reach
        done = max(arrive) + ALLREDUCE
        for r, p in enumerate(part):
            t1 = done + p["optimizer"] * backward + p["other"]
            phases = ({"data": p["data"], "forward": p["forward"], "backward": done - reach[r],
                       "optimizer": p["optimizer"], "collective": p["gather"]} if backward else
                      {"data": p["data"], "forward": 0.0, "backward": 0.0, "optimizer": 0.0,
                       "collective": done - reach[r]})
            profiled = every > 0 and s % every == every - 1
            steps[r].append(StepRecord(step=s, t0=clock[r], t1=t1, phases=phases,
                                       profiled=profiled, window=False,
                                       mem=_mem(r, s, cuda, alloc, rss)))
            if profiled and not cuda:
                grow = modelled.get(r, 0) * s
                summaries[r].append({"rank": r, "step": s, "t0": clock[r], "t1": t1,
                                     "step_ms": (t1 - clock[r]) * 1e3,
                                     "memory": {"allocated": 50 * MiB + grow,
                                                "reserved": 64 * MiB + grow,
                                                "inactive_split": 2 * MiB, "largest_free": MiB,
                                                "peak_allocated": 60 * MiB + grow,
                                                "source": "modelled"}})
            clock[r] = t1
    return steps, summaries


def test_a_rank_slow_at_loading_data_is_named_and_the_data_blamed():
    """Rank 2 takes 30 ms more for its batch; the others wait those 30 ms in backward."""
    steps, _ = simulate(extra={2: {"data": 0.030}})
    others_backward = [s.phases["backward"] for s in steps[0]]
    assert min(others_backward) > steps[2][0].phases["backward"] + 0.029
    v = slow_rank(steps)
    assert (v.rank, v.cause) == (2, "data")
    said = v.finding
    assert said.sentence.startswith("rank 2 is the slow rank: its data loading took 40.0 ms "
                                    "per step, 4.0x the others' median (10.0 ms)")
    assert "the others waited 30.0 ms per step for it (last in 20 of the last 20 steps)" in said.sentence
    assert said.severity == "warning" and "DataLoader" in said.advice
    assert said.value("wait_per_step_ms") == pytest.approx(30.0)
    assert v.late_share == 1.0 and v.steps == 20
    assert abs(v.skew_pct) < 1  # DDP evens the step times out: skew alone would miss it


def test_a_rank_with_extra_forward_compute_is_blamed_on_compute():
    v = slow_rank(simulate(extra={1: {"forward": 0.025}})[0])
    assert (v.rank, v.cause) == (1, "compute")
    assert "rank 1 is the slow rank: its forward, optimizer and other work took" in v.finding.sentence
    assert "others waited 25.0 ms" in v.finding.sentence


def test_equal_ranks_have_no_slow_rank():
    v = slow_rank(simulate()[0])
    assert v.rank is None and v.cause is None
    assert v.finding.sentence == (
        "no slow rank: step times within 1% of each other (median 51.0 ms over the last 20 steps); phase times: "
        "host timers "
        "(with NCCL the wait shows in the phase that next blocks on the GPU)")
    assert v.finding.severity == "passed"
    assert round(v.median_step_ms, 3) == 51.0 and v.late_share == 0.0


def test_noise_on_every_phase_still_names_the_right_rank():
    for seed in range(5):
        steps, _ = simulate(ranks=8, n=60, extra={5: {"data": 0.015}}, noise=0.002, seed=seed)
        v = slow_rank(steps)
        assert (v.rank, v.cause) == (5, "data"), (seed, v.finding)


def test_noise_alone_names_nobody():
    for seed in range(5):
        v = slow_rank(simulate(ranks=8, n=60, noise=0.002, seed=seed)[0])
        assert v.rank is None, (seed, v.finding)
        assert v.finding.sentence.startswith("no slow rank")


def test_a_rank_that_died_leaves_the_steps_every_rank_finished():
    steps, _ = simulate(extra={0: {"data": 0.030}})
    steps[3] = steps[3][:12]
    v = slow_rank(steps)
    assert (v.rank, v.cause, v.steps) == (0, "data", 12)
    assert "last in 12 of 12 steps" in v.finding.sentence


def test_a_live_window_uses_the_last_common_steps():
    """Rank 1 is slow only lately; rank 3's newest steps have not arrived yet."""
    early, _ = simulate(n=30)
    late, _ = simulate(n=30, extra={1: {"data": 0.020}})
    steps = [e + [rec.replace(step=rec.step + 30) for rec in lt] for e, lt in zip(early, late, strict=True)]
    steps[3] = steps[3][:-5]
    v = slow_rank(steps, window=20)
    assert (v.rank, v.cause, v.steps) == (1, "data", 20)
    assert slow_rank(steps, window=None).rank is None  # over all 55 steps it is late in too few


def test_one_rank_or_no_common_step_names_nobody():
    said = slow_rank(simulate(ranks=1)[0]).finding
    assert (said.sentence, said.severity) == ("no slow rank: one rank, nothing to compare",
                                              "not applicable")
    steps, _ = simulate(ranks=2)
    steps[1] = []
    assert str(slow_rank(steps).finding) == "no slow rank: only one rank has reported steps"
    assert str(slow_rank([[], []]).finding) == "no slow rank: no rank has reported a step"


def test_an_explicit_all_reduce_loop_without_backward():
    """No backward: the wait is in the collective, rank 1's extra work is untimed (other)."""
    v = slow_rank(simulate(extra={1: {"bwd": 0.020}}, backward=False)[0])
    assert (v.rank, v.cause) == (1, "compute")
    assert "others waited 20.0 ms" in v.finding.sentence


def test_records_with_missing_phases_and_memory_still_name_the_rank():
    """Phases that were never timed are absent or null; memory was not sent."""
    steps, _ = simulate(extra={3: {"bwd": 0.020}}, backward=False)
    steps = [[rec.replace(mem=None) for rec in recs] for recs in steps]
    for recs in steps:
        for rec in recs:
            del rec.phases["forward"], rec.phases["backward"]
            rec.phases["optimizer"] = None
    v = slow_rank(steps)
    assert (v.rank, v.cause) == (3, "compute")
    assert memory_creep(steps, []) == []
    row = rank_table(steps, [])[3]
    assert row["backward_ms"] is None and row["allocated"] is None and row["source"] is None


def test_a_rank_held_up_in_its_own_collective():
    """Rank 0 gathers results from the others before backward: it reaches DDP's
    all_reduce last, having spent the time in a collective."""
    v = slow_rank(simulate(extra={0: {"gather": 0.020}})[0])
    assert (v.rank, v.cause) == (0, "collective")
    assert "its own collectives took" in v.finding.sentence
    assert "others waited 20.0 ms" in v.finding.sentence


def test_a_gap_no_measured_part_explains():
    """Rank 2's steps are shorter than its peers' (its clock ends the step before
    the optimizer), so its lead cannot be pinned on data or compute."""
    steps, _ = simulate(extra={2: {"data": 0.030}})
    steps[2] = [rec.replace(t1=rec.t1 - 0.040) for rec in steps[2]]
    for rec in steps[2]:
        rec.phases["data"] -= 0.030
    v = slow_rank(steps)
    assert v.rank == 2 and v.cause is None
    assert "no measured part explains it (data +0.0 ms" in v.finding.sentence


def test_step_rows_and_rank_table_show_phases_in_ms():
    steps, summaries = simulate(extra={2: {"data": 0.030}})
    steps[0][0].phases["collective"] = None  # not measured stays unmeasured
    rows = step_rows(steps)
    assert len(rows) == 160
    first = rows[0]
    assert first["collective_ms"] is None and round(first["data_ms"], 3) == 10.0
    assert round(first["step_ms"], 3) == 81.0 and round(first["other_ms"], 3) == 3.0
    table = rank_table(steps, summaries)
    assert [round(t["data_ms"], 3) for t in table] == [10.0, 10.0, 40.0, 10.0]
    assert table[1]["allocated"] == 100 * MiB and table[1]["frag"] == 8 / 160


def test_memory_creep_on_one_rank_is_named():
    steps, summaries = simulate(alloc={1: 4 * MiB, 0: 1024})
    creep = memory_creep(steps, summaries)
    assert [c.rank for c in creep] == [1]
    assert creep[0].words == ("rank 1: memory creep, +4.0 MiB per step over steps 7-38, the last 32 "
                              "measured (allocated)")
    assert creep[0].total_bytes == 31 * 4 * MiB
    table = rank_table(steps, summaries)
    assert table[1]["peak_allocated"] == 100 * MiB + 39 * 4 * MiB


def test_rss_creep_on_a_cpu_run_without_summaries():
    steps, _ = simulate(cuda=False, rss={0: 2 * MiB})
    creep = memory_creep(steps, [])
    assert [(c.rank, c.source) for c in creep] == [(0, "rss")]
    assert creep[0].words.endswith("+2.0 MiB per step over steps 7-38, the last 32 measured (RSS)")


def test_cpu_creep_is_judged_on_rss_not_on_the_per_step_modelled_figures():
    """A modelled figure replays one profiled step from an empty allocator, so it
    says nothing about growth between steps: rank 3's modelled growth alone is not
    creep, rank 1's RSS growth is, on the same CPU run with summaries."""
    steps, summaries = simulate(cuda=False, modelled={3: MiB}, rss={1: 2 * MiB}, every=5)
    creep = memory_creep(steps, summaries)
    assert [(c.rank, c.source) for c in creep] == [(1, "rss")]
    assert creep[0].words.endswith("(RSS)")
    table = rank_table(steps, summaries)
    assert table[3]["source"] == "modelled" and table[3]["allocated"] == 50 * MiB + 39 * MiB


def test_small_or_shared_growth_is_not_creep():
    steps, summaries = simulate(alloc={r: 1024 for r in range(4)})
    assert memory_creep(steps, summaries) == []


def _run(profiling):
    return DdpRun(world_size=4, backend="gloo", outcome="finished", profiling=profiling)


def test_checklist_lines_only_for_profiled_runs():
    assert {"slow rank", "rank memory"}.isdisjoint(i.name for i in checklist(_run(None)))
    steps, summaries = simulate(extra={2: {"data": 0.030}}, alloc={1: 4 * MiB})
    run = _run(RankProfiling(steps=steps, summaries=summaries))
    items = {i.name: i for i in checklist(run)}
    slow, memory = items["slow rank"], items["rank memory"]
    assert slow.status == "warning" and slow.evidence.startswith("rank 2 is the slow rank")
    assert "DataLoader" in slow.advice and slow.details["rank"] == 2
    assert memory.status == "warning"
    assert memory.evidence.startswith("rank 1: memory creep, +4.0 MiB per step")
    assert "rank 0: allocated 100.0 MiB (peak 100.0 MiB), reserved 160.0 MiB" in memory.evidence
    assert "fragmentation 5%" in memory.evidence
    assert summary(list(items.values()), run).endswith("; warning: slow rank, rank memory")


def test_checklist_passes_a_balanced_profiled_run():
    steps, summaries = simulate(cuda=False)
    items = {i.name: i for i in checklist(_run(RankProfiling(steps=steps, summaries=summaries)))}
    assert items["slow rank"].status == "passed"
    assert items["slow rank"].evidence.startswith("no slow rank: step times within")
    assert items["rank memory"].status == "passed"
    assert "rank 0 (modelled): allocated 50.0 MiB" in items["rank memory"].evidence


def test_a_live_window_of_8_ranks_is_cheap():
    """The live view calls these twice a second; about 30 ms on a loaded 2-core
    box. The best of three runs, against a bound that only a loop over pairs of
    records (or of ranks and steps squared) would break."""
    steps, summaries = simulate(ranks=8, n=400, noise=0.001)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        slow_rank(steps)
        memory_creep(steps, summaries)
        rank_table(steps, summaries)
        best = min(best, time.perf_counter() - start)
    assert best < 0.5


def test_rss_warm_up_stairs_and_wobble_are_not_creep():
    """What a real 4-rank CPU run showed: RSS rising in a few steps early on, then
    wobbling by tens of KiB, with no leak: nothing is named."""
    steps, _ = simulate(cuda=False)
    rng = random.Random(3)
    for rank, records in enumerate(steps):
        for i, rec in enumerate(records):
            stairs = (3 * MiB if rec.step >= 9 else 0) + (2 * MiB if rec.step >= 15 else 0)
            rss = rec.mem.rss + stairs + rng.randint(-64, 64) * 1024 * (rank + 1)
            records[i] = rec.replace(mem=rec.mem.replace(rss=rss))
    assert memory_creep(steps, []) == []


def test_no_slow_rank_gives_the_spread_the_rank_table_shows() -> None:
    """Two ranks whose median steps are 156 and 210 ms, neither waited for in
    a way that stands out: the words say 35% apart, as the ranks' rows do, not
    15% (the slower rank against the median of the two)."""
    from torchlens.analysis.ranks.slow import slow_rank
    from torchlens.model.records import StepRecord

    steps = []
    for _rank, ms in ((0, 156.0), (1, 210.0)):
        recs, t = [], 0.0
        for s in range(20):
            wait = 5.0 + (s * 7 % 5)  # the same swing on both: nobody is late
            recs.append(StepRecord(step=s, t0=t, t1=t + ms / 1e3, phases={
                "data": 1e-3, "forward": (ms - wait - 2.0) / 1e3, "backward": wait / 1e3,
                "optimizer": 1e-3, "collective": 0.0}))
            t += ms / 1e3
        steps.append(recs)
    v = slow_rank(steps)
    assert v.rank is None
    assert "step times within 35% of each other" in v.finding.sentence, v.finding.sentence
