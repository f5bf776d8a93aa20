"""Phases timed on the GPU with CUDA events, on hardware this machine does not
have, through a fake of exactly torch.cuda.Event (``fake_cuda``): with NCCL
the host enqueues and moves on, so the slow rank is named from the GPU's
times; a CPU rank never makes an event; an event the GPU has not reached is
neither read nor waited for.
"""

from __future__ import annotations

import pytest
import torch
from msgspec import UNSET

from torchlens.analysis.ranks.slow import slow_rank
from torchlens.capture.ranks.phases import PHASES
from torchlens.capture.ranks.stepper import RankProfiler

from .fake_cuda import FakeCuda, Gpu

FORWARD, COLLECTIVE = PHASES.index("forward"), PHASES.index("collective")
WAITS = ("synchronize", "event.synchronize", "stream.synchronize")


def _profiler(tmp_path, rank: int, device: torch.device | None) -> RankProfiler:
    rp = RankProfiler(rank=rank, run_dir=str(tmp_path), device=device, every=10_000)
    rp.start()
    return rp


def _nccl_rank(tmp_path, monkeypatch, rank: int, forward_ms: float, steps: int):
    """One rank of an explicit all_reduce loop on NCCL: the host only enqueues
    (its timers see microseconds); on the GPU the all_reduce waits for the
    slowest forward, 30 ms, then exchanges for 1 ms. The GPU catches up at the
    next step's start (a ``loss.item()``), so a step's events complete after
    its ``step()``."""
    fake = FakeCuda([Gpu(uuid="GPU-x")]).install(monkeypatch)
    fake.set_device(0)
    rp = _profiler(tmp_path / f"r{rank}", rank, torch.device("cuda", 0))
    forward = rp.clock._wrap(FORWARD, lambda: fake.work(forward_ms))
    all_reduce = rp.clock._wrap(COLLECTIVE, lambda: fake.work(30.0 - forward_ms + 1.0))
    for _ in range(steps):
        fake.complete()
        forward()
        all_reduce()
        rp.step()
    rp.finish()
    assert not rp.errors, rp.errors
    assert not [c for c in fake.calls if c[0] in WAITS]
    return rp.records


def test_the_slow_rank_is_named_from_gpu_times_where_host_timers_see_nothing(
        tmp_path, monkeypatch) -> None:
    steps = [_nccl_rank(tmp_path, monkeypatch, r, 30.0 if r == 2 else 10.0, 12)
             for r in range(3)]
    # rank 0 waits 21 ms per step in the all_reduce on its GPU; its host timer saw µs
    gpu = {g.step: g for rec in steps[0] if rec.gpu for g in rec.gpu}
    assert sorted(gpu) == list(range(11))  # the last step's events complete later
    assert gpu[5].phases["collective"] == pytest.approx(0.021)
    assert gpu[5].step_s == pytest.approx(0.031)
    assert steps[0][5].phases["collective"] < 0.001
    v = slow_rank(steps)
    assert (v.rank, v.cause) == (2, "compute")
    assert v.timed_by == {"gpu": [0, 1, 2], "host": []}
    assert v.finding.sentence.startswith(
        "rank 2 is the slow rank: its forward, optimizer and other work took 30.0 ms per step, "
        "3.0x the others' median (10.0 ms); the others waited 20.0 ms per step for it "
        "(last in 11 of 11 steps); phase times: GPU time between CUDA events")
    # the same steps on host timers alone: the wait is not in any host phase
    host = slow_rank([[rec.replace(gpu=UNSET) for rec in recs] for recs in steps])
    assert host.rank is None
    assert host.finding.sentence.endswith(
        "phase times: host timers (with NCCL the wait shows in the phase that next blocks "
        "on the GPU)")


def test_a_rank_with_gpu_times_beside_one_without_says_which_is_which(
        tmp_path, monkeypatch) -> None:
    steps = [_nccl_rank(tmp_path, monkeypatch, r, 30.0 if r == 1 else 10.0, 8)
             for r in range(2)]
    steps.append([rec.replace(gpu=UNSET) for rec in steps[0]])  # rank 2: host timers only
    v = slow_rank(steps)
    assert v.timed_by == {"gpu": [0, 1], "host": [2]}
    assert ("phase times: GPU time between CUDA events on ranks 0-1, host timers on rank 2 "
            "(with NCCL") in v.finding.sentence


@pytest.mark.parametrize("initialised, device", [
    (False, None),  # the job never touched CUDA: its device is the CPU
    (False, torch.device("cuda", 0)),  # named a GPU, but CUDA is not up
    (True, torch.device("cpu")),  # something started CUDA; the job computes on the CPU
])
def test_a_cpu_rank_never_makes_a_cuda_event(tmp_path, monkeypatch, initialised,
                                             device) -> None:
    fake = FakeCuda([Gpu(uuid="GPU-x")]).install(monkeypatch)
    if initialised:
        fake.set_device(0)
    rp = _profiler(tmp_path, 0, device)
    forward = rp.clock._wrap(FORWARD, lambda: None)
    for _ in range(4):
        forward()
        rp.step()
    rp.finish()
    assert fake.events == [] and rp.clock.gpu is None
    assert fake.inits == (["set_device"] if initialised else [])  # no CUDA context made here
    assert all(rec.gpu is UNSET for rec in rp.records)
    assert "gpu" not in rp.records[0].to_dict()


def test_events_the_gpu_has_not_reached_are_not_read_nor_waited_for(
        tmp_path, monkeypatch) -> None:
    fake = FakeCuda([Gpu(uuid="GPU-x")]).install(monkeypatch)
    fake.set_device(0)
    rp = _profiler(tmp_path, 0, torch.device("cuda", 0))
    forward = rp.clock._wrap(FORWARD, lambda: fake.work(5.0))
    for _ in range(3):  # the host runs three steps ahead of a GPU that finished nothing
        forward()
        rp.step()
    assert [rec.gpu for rec in rp.records] == [UNSET] * 3
    assert not [c for c in fake.calls if c[0] in (*WAITS, "event.elapsed_time")]
    fake.complete()  # the GPU catches up with steps 0-2; step 3's forward is queued after
    forward()
    rp.step()
    late = rp.records[-1].gpu
    assert [g.step for g in late] == [0, 1, 2]
    assert [g.phases["forward"] for g in late] == [pytest.approx(0.005)] * 3
    assert not rp.errors and rp.clock.gpu is not None
    fake.complete()
    rp.step()
    assert [g.step for g in rp.records[-1].gpu] == [3, 4]
    rp.finish()


def test_events_come_from_a_pool_and_a_captured_step_has_no_gpu_times(
        tmp_path, monkeypatch) -> None:
    fake = FakeCuda([Gpu(uuid="GPU-x")]).install(monkeypatch)
    fake.set_device(0)
    rp = _profiler(tmp_path, 0, torch.device("cuda", 0))
    forward = rp.clock._wrap(FORWARD, lambda: fake.work(2.0))
    for i in range(50):
        fake.capturing = i == 10  # a CUDA graph captured inside step 10's forward
        forward()
        fake.capturing = False
        rp.step()
        fake.complete()
    rp.finish()
    read = [g.step for rec in rp.records if rec.gpu for g in rec.gpu]
    assert read == [s for s in range(49) if s != 10]
    # two steps in flight (2 phase events each and the marks around them), reused: not 150
    assert len(fake.events) <= 7
    assert not rp.errors


def test_the_rank_table_times_steps_as_the_verdict_does(tmp_path, monkeypatch) -> None:
    # on a GPU run the verdict compared GPU times while the table
    # showed host timers, so its median step and the table's disagreed
    from torchlens.analysis.ranks.steps import rank_table

    steps = [_nccl_rank(tmp_path, monkeypatch, r, 30.0 if r == 2 else 10.0, 12)
             for r in range(3)]
    v = slow_rank(steps)
    rows = rank_table(steps, [[] for _ in steps], window=20)
    assert [row["step_ms"] for row in rows] == pytest.approx([31.0] * 3)
    assert v.median_step_ms == pytest.approx(rows[0]["step_ms"])
    assert rows[0]["collective_ms"] == pytest.approx(21.0)  # the host timer saw µs
    assert rows[2]["forward_ms"] == pytest.approx(30.0)
    assert [row["steps"] for row in rows] == [12] * 3  # every step counted, timed or not yet
