"""The checklist's "two ranks use the same GPU" tells GPUs apart by UUID.

Under per-rank ``CUDA_VISIBLE_DEVICES`` (Slurm ``--gpus-per-task``,
Kubernetes) every rank's device is ``cuda:0`` on a GPU of its own; the rank
reports the UUID ``torch.cuda.get_device_properties(d).uuid`` gives, read
here through the fake of that boundary, one process (one rank) at a time.
"""

from __future__ import annotations

import torch

from torchlens.analysis.ddp.checks import check_environment
from torchlens.capture.ranks.cuda_device import device_uuid
from torchlens.model import DdpRun
from torchlens.model.findings import FAILED, PASSED

from .fake_cuda import FakeCuda, one_visible_gpu


def _report(rank: int, uuid: str | None, host: str = "node-a") -> dict:
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "2",
           "RANK": str(rank), "LOCAL_RANK": str(rank)}
    return {"rank": rank, "device": "cuda:0", "device_uuid": uuid, "hostname": host,
            "env_start": env, "versions": {"torch": "2.13", "cuda": "12.8", "nccl": "2.27"}}


def _uuid_seen_by_rank(monkeypatch, physical: str) -> str | None:
    with monkeypatch.context() as mp:
        fake = FakeCuda(one_visible_gpu(physical)).install(mp)
        fake.set_device(0)  # torch.cuda.set_device(0): the only GPU it sees
        return device_uuid(torch.device("cuda", 0))


def test_every_rank_on_cuda_0_of_its_own_gpu_passes(monkeypatch) -> None:
    uuids = [_uuid_seen_by_rank(monkeypatch, u) for u in ("GPU-1111", "GPU-2222")]
    finding = check_environment(DdpRun(world_size=2, ranks=[_report(r, u)
                                                             for r, u in enumerate(uuids)]))
    assert finding.status == PASSED, finding.evidence
    assert "no GPU UUID" not in finding.evidence


def test_two_ranks_on_one_physical_gpu_fail_naming_it() -> None:
    finding = check_environment(DdpRun(world_size=2, ranks=[_report(0, "GPU-1111"),
                                                            _report(1, "GPU-1111")]))
    assert finding.status == FAILED
    assert "ranks 0, 1 use the same GPU (UUID GPU-1111)" in finding.evidence


def test_without_uuids_host_and_name_stand_in_and_the_evidence_says_so() -> None:
    apart = check_environment(DdpRun(world_size=2, ranks=[_report(0, None, "node-a"),
                                                          _report(1, None, "node-b")]))
    assert apart.status == PASSED and "reported no GPU UUID" in apart.evidence
    same = check_environment(DdpRun(world_size=2, ranks=[_report(0, None), _report(1, None)]))
    assert same.status == FAILED and "cuda:0 on node-a, no UUID reported" in same.evidence


def test_no_uuid_before_cuda_starts_or_on_the_cpu(monkeypatch) -> None:
    fake = FakeCuda(one_visible_gpu("GPU-1111")).install(monkeypatch)
    assert device_uuid(torch.device("cuda", 0)) is None and fake.inits == []
    assert device_uuid(torch.device("cpu")) is None
