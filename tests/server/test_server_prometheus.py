"""The Jupyter server's own /metrics carries torchlens's GPU and host series (fake NVML),
behind the server's token."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest
from fake_monitor import install_fake_gpus
from fake_nvml import gpu
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import HTTPClientError


def _series(body: bytes) -> dict[str, list]:
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(body.decode())}


@pytest.fixture
def jp_server_config(jp_server_config: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Two fake GPUs from the monitor's first sample on (fake_monitor.py says why)."""
    install_fake_gpus(monkeypatch, [gpu("GPU-a"), gpu("GPU-b", util=pynvml.NVMLError_NotSupported)])
    return jp_server_config


async def test_gpu_series_with_the_token(jp_fetch: Any, monitor: Any) -> None:
    monitor.sample_once()
    got = _series((await jp_fetch("metrics")).body)
    used = {labels["gpu"]: v for labels, v in got["torchlens_gpu_memory_used_bytes"]}
    assert used == {"0": 10 * 2**30, "1": 10 * 2**30}
    assert {labels["gpu"]: v for labels, v in got["torchlens_gpu_memory_total_bytes"]}["0"] == 40 * 2**30
    # a figure the device does not report is absent, not 0
    assert [(labels["gpu"], v) for labels, v in got["torchlens_gpu_utilization_ratio"]] == [("0", 0.42)]
    assert got["torchlens_gpu_count"][0][1] == 2
    assert 0 <= got["torchlens_host_cpu_utilization_ratio"][0][1] <= 1
    assert got["torchlens_monitor_sample_age_seconds"][0][1] < 60
    # labels: this machine and the device; no process, path or user string
    keys = {k for name, samples in got.items() if name.startswith("torchlens_")
            for lab, _ in samples for k in lab}
    assert keys == {"host", "gpu"}


async def test_refused_without_the_token(jp_fetch: Any, monitor: Any) -> None:
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("metrics", headers={"Authorization": ""})
    assert err.value.code == 403
