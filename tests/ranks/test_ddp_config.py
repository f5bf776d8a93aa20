"""How a DDP job synchronises its gradients: the rank side counts each step's
gradient all-reduce passes and reads DDP's bucket layout (``PhaseClock``),
and the rules name accumulation without ``no_sync()`` and buckets far too
small on every rank, while the twins (``no_sync()`` used, default buckets)
stay clean."""

from __future__ import annotations

import contextlib
import socket

import pytest
import torch
import torch.distributed as dist

from torchlens.analysis.ranks.ddp_config import (
    accumulation_sync,
    ddp_config,
    small_buckets,
)
from torchlens.capture.ranks.phases import BUCKETS_AFTER, PhaseClock
from torchlens.model.records import DdpStep, StepRecord


def _rec(step: int, ddp: DdpStep | None) -> StepRecord:
    t0 = step * 0.1
    return StepRecord(step=step, t0=t0, t1=t0 + 0.05, phases={"forward": 0.01},
                      **({"ddp": ddp} if ddp is not None else {}))


def _ranks(ddp: DdpStep | None, n: int = 2, steps: int = 30) -> list[list[StepRecord]]:
    return [[_rec(i, ddp) for i in range(steps)] for _ in range(n)]


def test_accumulation_that_all_reduces_every_micro_batch_is_named_on_every_rank() -> None:
    found = accumulation_sync(_ranks(DdpStep(syncs=4)))
    assert found is not None and found.code == "accumulation_sync", found
    assert found.ranks == (0, 1) and found.value("syncs_per_step") == 4
    assert "4 times per optimizer step" in found.sentence and "no_sync()" in found.advice


def test_one_sync_per_step_or_no_ddp_is_clean() -> None:
    assert accumulation_sync(_ranks(DdpStep(syncs=1))) is None  # no_sync() used
    assert accumulation_sync(_ranks(None)) is None  # no DDP forward counted
    # one rank syncing once a step: the job is not accumulating without no_sync
    mixed = [[_rec(i, DdpStep(syncs=4)) for i in range(30)],
             [_rec(i, DdpStep(syncs=1)) for i in range(30)]]
    assert accumulation_sync(mixed) is None


def test_a_tiny_bucket_cap_is_named_and_the_default_is_not() -> None:
    tiny = DdpStep(syncs=1, bucket_cap_bytes=1048, buckets=3, bucket_bytes=403_488)
    found = small_buckets(_ranks(tiny))
    assert found is not None and found.code == "small_buckets" and found.ranks == (0, 1)
    assert "3 buckets" in found.sentence and "at the default 25 MB, 1 bucket" in found.sentence
    default = DdpStep(syncs=1, bucket_cap_bytes=25 << 20, buckets=1, bucket_bytes=403_488)
    assert small_buckets(_ranks(default)) is None
    # a large model under the default cap has many buckets: that is no problem
    large = DdpStep(syncs=1, bucket_cap_bytes=25 << 20, buckets=40, bucket_bytes=1 << 30)
    assert small_buckets(_ranks(large)) is None
    assert ddp_config(_ranks(tiny)) is not None


def test_records_of_older_versions_without_ddp_decode() -> None:
    rec = StepRecord.from_dict({"step": 0, "t0": 1.0, "t1": 2.0, "phases": {}})
    assert ddp_config([[rec] * 30, [rec] * 30]) is None


@pytest.fixture
def group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def _train(model: torch.nn.Module, clock: PhaseClock, micro: int, no_sync: bool) -> DdpStep | None:
    for m in range(micro):
        last = m == micro - 1
        ctx = model.no_sync() if no_sync and not last else contextlib.nullcontext()
        with ctx:
            model(torch.randn(2, 64)).sum().backward()
    return clock.take_ddp()


def test_the_rank_side_counts_syncs_and_reads_the_buckets(group) -> None:
    clock = PhaseClock()
    clock.install()
    try:
        layers = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])
        model = torch.nn.parallel.DistributedDataParallel(layers, bucket_cap_mb=0.001)
        taken = [_train(model, clock, 4, no_sync=False) for _ in range(3)]
        assert [t.syncs for t in taken] == [4, 4, 4]  # every micro-batch all-reduces
        assert taken[-1].buckets == 6 and taken[-1].bucket_cap_bytes < 1 << 20
        assert taken[-1].bucket_bytes == 6 * (64 * 64 + 64) * 4
        assert _train(model, clock, 4, no_sync=True).syncs == 1  # no_sync() on the others
        with torch.no_grad():
            model(torch.randn(2, 64))  # an evaluation's forward all-reduces nothing
        assert clock.take_ddp() is None
    finally:
        clock.remove()
    assert BUCKETS_AFTER < 12  # read within the steps above


def test_a_raising_count_leaves_the_forward_running(group, monkeypatch) -> None:
    from torchlens.capture.ranks import phases

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("torchlens' own bug")

    monkeypatch.setattr(phases, "bucket_layout", broken)
    clock = PhaseClock()
    clock.install()
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
        for _ in range(6):
            out = model(torch.randn(2, 64))
            out.sum().backward()
        assert out.shape == (2, 64) and clock.hook_errors == 1  # tried once, then left alone
    finally:
        clock.remove()


def _summed(sums: list[float], moved: list[bool]) -> list[list[StepRecord]]:
    """Each rank: 30 steps; at step 24 its parameters' sum, at 25 whether they moved."""
    out = []
    for total, went in zip(sums, moved, strict=True):
        recs = []
        for i in range(30):
            ddp = (DdpStep(syncs=1, param_sum=total) if i == 24 else
                   DdpStep(syncs=1, params_moved=went) if i == 25 else DdpStep(syncs=1))
            recs.append(_rec(i, ddp))
        out.append(recs)
    return out


def test_a_rank_that_changes_its_parameters_outside_the_optimizer_is_named() -> None:
    from torchlens.analysis.ranks.ddp_config import parameter_sync

    found = parameter_sync(_summed([10.5, 12.25], [False, True]))
    assert found is not None and found.code == "parameter_sync" and found.ranks == (1,)
    assert found.severity == "failed" and "after step 24" in found.sentence
    assert "rank 1 changed its parameters between an optimizer step" in found.sentence


def test_the_odd_rank_out_is_named_and_equal_replicas_are_clean() -> None:
    from torchlens.analysis.ranks.ddp_config import parameter_sync

    odd = parameter_sync(_summed([3.0, 3.0, 4.5, 3.0], [False] * 4))
    assert odd is not None and odd.ranks == (2,)
    # two ranks, neither saw its own change: both are named
    both = parameter_sync(_summed([3.0, 4.5], [False, False]))
    assert both is not None and both.ranks == (0, 1)
    # a clamp after the optimizer on every rank: moved alike, equal sums: no finding
    assert parameter_sync(_summed([7.0, 7.0], [True, True])) is None


def test_the_rank_side_sums_parameters_after_the_optimizer_and_sees_them_move(group) -> None:
    from torchlens.capture.ranks.phases import PARAM_EVERY

    clock = PhaseClock()
    clock.install()
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        taken = []
        for i in range(2 * PARAM_EVERY + 1):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            if i == 2 * PARAM_EVERY - 1:  # a change outside the optimizer, after its check
                with torch.no_grad():
                    model.module.weight.add_(1.0)
            taken.append(clock.take_ddp())
        sums = [t.param_sum for t in taken if t.param_sum is not None]
        assert len(sums) == 2  # after optimizer steps 25 and 50
        moved = [t.params_moved for t in taken if t.params_moved is not None]
        assert moved == [False, True], moved
    finally:
        clock.remove()
