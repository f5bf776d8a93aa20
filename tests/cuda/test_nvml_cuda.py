"""The NVML sampler (the sidebar's) against ``nvidia-smi`` for the same GPU."""

from __future__ import annotations

import shutil
import subprocess
import time

import msgspec
import pytest
import torch


def _smi() -> list[dict[str, str]]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=uuid,memory.used,utilization.gpu,name",
                          "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    keys = ("uuid", "mem_used_mib", "util", "name")
    return [dict(zip(keys, (c.strip() for c in line.split(",")), strict=False)) for line in out.splitlines()]


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="nvidia-smi not on PATH")
def test_sampler_agrees_with_nvidia_smi(figures: dict) -> None:
    from torchlens.capture.monitor.gpu import NvmlSampler

    hold = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")  # 2 GiB in use
    torch.cuda.synchronize()
    sampler = NvmlSampler()
    try:
        assert sampler.available, sampler.status
        t0 = time.perf_counter()
        got = msgspec.to_builtins(sampler.sample())  # as the page gets it
        sample_s = time.perf_counter() - t0
        smi = _smi()
    finally:
        sampler.close()
    by_uuid = {g["uuid"]: g for g in got["gpus"]}
    figures.update(sample_s=sample_s, status=got["status"], smi=smi,
                   gpus=[{k: g.get(k) for k in ("uuid", "cuda", "mem_used", "util_gpu",
                                                "pcie_tx_bps", "nvlink_tx_bps")}
                         for g in got["gpus"]])
    for row in smi:
        assert row["uuid"] in by_uuid, (row, list(by_uuid))
        mine = by_uuid[row["uuid"]]
        used_mib = mine["mem_used"] / 2**20
        assert abs(used_mib - float(row["mem_used_mib"])) < 256, (used_mib, row)
        assert used_mib >= 2048
    # cuda:0 is the GPU torch uses: same UUID as torch's own
    uuid0 = str(torch.cuda.get_device_properties(0).uuid)
    cuda0 = [g for g in got["gpus"] if g.get("cuda") == 0]
    assert cuda0 and uuid0.replace("GPU-", "") in cuda0[0]["uuid"], (uuid0, cuda0)
    del hold
