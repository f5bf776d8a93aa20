"""Host time inside a rank's phases: Python's garbage collections and the
wait for a CPU (``StepRecord.host``) name a slow rank's cause when they explain
its extra time (``gc``, ``cpu_contention``), and the rank side measures both."""

from __future__ import annotations

import gc

from torchlens.analysis.ranks.slow import slow_rank
from torchlens.capture.ranks.host_time import HostTime
from torchlens.model.records import HostStep, StepRecord

T0 = 1795804276.0


def _run(gc_ms: float = 0.0, runq_ms: float = 0.0, forward_ms: float = 0.0, every: int = 1,
         steps: int = 60, cpu: bool = False) -> list[list[StepRecord]]:
    """Rank 1's forward is longer by ``gc_ms + runq_ms + forward_ms`` in every
    ``every``-th step, of which ``gc_ms`` in collections and ``runq_ms`` waiting
    for a CPU; rank 0 waits that long in its backward. ``cpu``: the records
    carry each rank's time on a CPU (its phases' work, not its waits)."""
    out = []
    for r in range(2):
        t, recs = T0, []
        for s in range(steps):
            hit = s % every == every - 1
            extra = (gc_ms + runq_ms + forward_ms) if hit else 0.0
            jitter = ((s * 7 + r * 3) % 11) * 0.05
            forward = 2.0 + jitter + (extra if r == 1 else 0.0)
            backward = 3.0 + (extra if r == 0 else 0.0)
            ms = 0.2 + forward + backward + 0.5 + 0.2
            on_cpu = 0.2 + forward + 3.0 + 0.5 - (runq_ms if hit and r == 1 else 0.0)
            host = HostStep(gc_s=(gc_ms if hit and r == 1 else 0.0) / 1e3,
                            runq_s=(runq_ms if hit and r == 1 else 0.01) / 1e3,
                            cpu_s=on_cpu / 1e3 if cpu else None)
            recs.append(StepRecord(step=s, t0=t, t1=t + ms / 1e3, host=host,
                                   phases={"data": 0.2e-3, "forward": forward / 1e3,
                                           "backward": backward / 1e3, "optimizer": 0.5e-3,
                                           "collective": 0.0, "save": 0.0, "eval": 0.0}))
            t += ms / 1e3
        out.append(recs)
    return out


def test_garbage_collections_every_few_steps_name_gc() -> None:
    # a 200 ms collection every 8 steps, beside 2 ms more work a step: the median
    # step sees only the work, the average sees the collections
    v = slow_rank(_run(gc_ms=200.0, forward_ms=2.0, every=8))
    assert (v.rank, v.cause) == (1, "gc"), v.finding
    assert "garbage collection" in v.finding.sentence and "gc.freeze()" in v.finding.advice


def test_a_busy_core_names_cpu_contention() -> None:
    v = slow_rank(_run(runq_ms=30.0, forward_ms=2.0))
    assert (v.rank, v.cause) == (1, "cpu_contention"), v.finding
    assert "another process" in v.finding.sentence


def test_a_busy_core_with_the_same_work_is_contention_on_the_cpu_clock_too() -> None:
    v = slow_rank(_run(runq_ms=30.0, forward_ms=2.0, cpu=True))
    assert (v.rank, v.cause) == (1, "cpu_contention"), v.finding


def test_more_work_that_also_queues_for_a_cpu_is_compute() -> None:
    """On a busy machine a rank with more work waits longer for a CPU too (a
    long run queues behind others' short bursts): when its own time on a CPU
    explains at least half its extra, the work is the cause (a 32x batch on a
    loaded 2-core machine: 10 ms more on a CPU, 24 ms more queued, 3.4 ms more
    in its forward)."""
    v = slow_rank(_run(runq_ms=8.0, forward_ms=10.0, cpu=True))
    assert v.rank == 1 and v.cause not in ("gc", "cpu_contention"), v.finding
    assert "forward" in v.finding.sentence


def test_compute_that_neither_explains_stays_compute() -> None:
    v = slow_rank(_run(gc_ms=1.0, runq_ms=1.0, forward_ms=30.0))
    assert v.rank == 1 and v.cause not in ("gc", "cpu_contention"), v.finding


def test_records_without_host_figures_give_the_old_causes() -> None:
    plain = [[r.replace(host=HostStep()) for r in recs] for recs in _run(forward_ms=30.0)]
    assert slow_rank(plain).cause not in ("gc", "cpu_contention")


def test_the_rank_side_times_collections_and_reads_its_run_queue() -> None:
    host = HostTime()
    host.install()
    try:
        live = [[i] for i in range(200_000)]  # tracked objects a full collection walks
        host.take()
        gc.collect()
        got = host.take()
        assert got is not None and got.gc_s is not None and got.gc_s > 0
        assert got.runq_s is None or got.runq_s >= 0  # Linux: the thread's run-queue wait
        assert got.cpu_s is None or got.cpu_s > 0  # and its time on a CPU (the collection)
        del live
    finally:
        host.remove()
    assert host._on_gc not in gc.callbacks  # the callback comes off


def _backward_bound(runq_ms: tuple[float, float], late_every: int = 3,
                    steps: int = 60) -> list[list[StepRecord]]:
    """Two ranks whose steps are mostly backward (an all-reduce-bound job), with
    a common swing of ±3 ms a step in it: rank 1 arrives last in 2 of every
    ``late_every`` steps by 1.5 ms, rank 0 in the rest by 1 ms; each rank waits
    ``runq_ms[r]`` a step for a CPU and runs 6 ms on one (the same work)."""
    out = []
    for r in range(2):
        t, recs = T0, []
        for s in range(steps):
            swing = ((s * 37) % 13 - 6) * 0.5
            late1 = s % late_every != late_every - 1
            backward = 14.0 + swing + ((1.5 if r == 0 else 0.0) if late1
                                       else (1.0 if r == 1 else 0.0))
            forward = 1.6 + ((s * 7 + r * 3) % 5) * 0.02
            ms = 0.4 + forward + backward + 0.7
            recs.append(StepRecord(step=s, t0=t, t1=t + ms / 1e3,
                                   host=HostStep(gc_s=0.0, runq_s=runq_ms[r] / 1e3,
                                                 cpu_s=6.0e-3),
                                   phases={"data": 0.4e-3, "forward": forward / 1e3,
                                           "backward": backward / 1e3, "optimizer": 0.7e-3,
                                           "collective": 0.0, "save": 0.0, "eval": 0.0}))
            t += ms / 1e3
        out.append(recs)
    return out


def test_a_shared_core_is_named_by_its_run_queue_when_the_order_is_weak() -> None:
    """A busy process on rank 1's core (the zoo's cpu_contention on a quiet
    machine): rank 1 waited 5.7 ms a step for a CPU against 0.8 ms, but its lost
    time lands in backward, where rank 0's wait lands too, so it is last in only
    2 of 3 steps by 1.5 ms, inside the others' swing: the order alone names nobody."""
    plain = [[r.replace(host=HostStep()) for r in recs]
             for recs in _backward_bound((0.8, 5.7))]
    assert slow_rank(plain).rank is None  # the order is not enough by itself
    v = slow_rank(_backward_bound((0.8, 5.7)))
    assert (v.rank, v.cause) == (1, "cpu_contention"), v.finding
    assert "wait for a CPU" in v.finding.sentence and "7.1x" in v.finding.sentence
    assert "pin ranks apart" in v.finding.advice and "waited 0.8 ms a step for a CPU themselves" in v.finding.advice, v.finding.advice


def test_an_even_run_queue_or_a_rank_nobody_waits_for_is_not_contention() -> None:
    # every rank waits for a CPU alike (a busy machine): nobody stands out
    assert slow_rank(_backward_bound((3.0, 3.5))).rank is None
    # rank 0 waits for a CPU, but the others do not wait for it: rank 1 is last
    assert slow_rank(_backward_bound((5.7, 0.8))).cause != "cpu_contention"
