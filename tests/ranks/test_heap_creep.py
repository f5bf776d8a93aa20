"""Creep judged on the C heap's bytes in use where ranks send them.

Hand-made records of a CPU run of 2 ranks and 12 steps: RSS rises 2 MiB per
step on both (the C allocator keeps its pages), while rank 1's heap in use
grows 1 MiB per step and rank 0's stays flat. On RSS alone the two are alike
and nobody is named; on the heap rank 1 is.
"""

from __future__ import annotations

from torchlens.analysis.ranks.steps import memory_creep
from torchlens.model.records import StepMemory, StepRecord

MiB = 1 << 20


def _run(heap_growth: tuple[int, int], heap: bool = True) -> list[list[StepRecord]]:
    return [[StepRecord(step=i, t0=i * 0.1, t1=i * 0.1 + 0.05, mem=StepMemory(
                 rss=(300 << 20) + i * 2 * MiB + (i % 3) * 4096, source="rss",
                 heap=((90 << 20) + i * heap_growth[r] + (i % 2) * 8192) if heap else None))
             for i in range(12)] for r in range(2)]


def test_rss_alike_on_every_rank_hides_the_rank_the_heap_names() -> None:
    assert memory_creep(_run((0, MiB), heap=False), []) == []  # RSS alone: alike
    (creep,) = memory_creep(_run((0, MiB)), [])
    assert (creep.rank, creep.source) == (1, "heap")
    assert creep.words == ("rank 1: memory creep, +1.0 MiB per step over steps 2-10, the last 9 measured "
                           "(C heap in use; RSS +16.0 MiB over the same steps)")


def test_an_even_heap_is_no_creep_and_a_shared_one_names_both() -> None:
    assert memory_creep(_run((0, 0)), []) == []
    # both ranks keep 1 MiB a step: a leak on every rank is still each rank's leak
    assert [(c.rank, c.source) for c in memory_creep(_run((MiB, MiB)), [])] == [
        (0, "heap"), (1, "heap")]


def test_a_small_heap_drift_is_no_creep() -> None:
    assert memory_creep(_run((0, 256 << 10)), []) == []  # 2.25 MiB over 10 steps


def _profiled_run(leak: int, stair: int = 3 * MiB, every: int = 16) -> list[list[StepRecord]]:
    """60 steps profiled every ``every`` from step 4 (as ``torchlens run`` does);
    the heap steps up ``stair`` at each profiled step (what torch.profiler kept
    on an FSDP1 job) and grows ``leak`` at every step."""
    profiled = {4, 9, *range(9 + every, 60, every)}
    out = []
    for _ in range(2):
        heap, recs = 110 * MiB, []
        for i in range(60):
            heap += leak + (stair if i in profiled else 0) + (i % 2) * 8192
            recs.append(StepRecord(step=i, t0=i * 0.1, t1=i * 0.1 + 0.05, profiled=i in profiled,
                                   mem=StepMemory(rss=300 * MiB + heap, source="rss", heap=heap)))
        out.append(recs)
    return out


def test_what_the_profiler_keeps_at_its_profiled_steps_is_no_creep() -> None:
    # 3 MiB at each of steps 25, 41 and 57: on one straight line, 200 KiB a step
    assert memory_creep(_profiled_run(leak=0), []) == []


def test_a_leak_through_the_profiled_steps_is_still_named() -> None:
    # named on the measured figures: the leak's 1 MiB a step, with what the
    # profiler kept at its three steps on top (a profiler that lets go later nets out)
    creeps = memory_creep(_profiled_run(leak=MiB), [])
    assert [c.rank for c in creeps] == [0, 1]
    assert all(1.0 * MiB < c.bytes_per_step < 1.3 * MiB for c in creeps), creeps
