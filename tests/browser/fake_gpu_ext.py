"""A test-only server extension that gives the monitor two fake GPUs (loaded before torchlens).

Why: the browser tests run without a GPU, so the per-GPU card (PCIe, NVLink,
the kernel tag on processes) would never be drawn. jupyter_server loads
extensions in alphabetical order, so this one installs a ``Monitor`` over the
NVML fake first and torchlens's loader, finding one, only adds its handlers.
GPU 0 has NVLink with counters that grow on every read and lists this
server's kernels as its processes; GPU 1 has no NVLink at all (NVML answers
its fields NOT_SUPPORTED). They are two models, so neither has a CUDA ordinal.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
from fake_nvml import FakeNvml, gpu
from tornado.ioloop import IOLoop

from torchlens.capture.monitor.gpu import NvmlSampler
from torchlens.capture.monitor.host import HostSampler
from torchlens.frontends.monitor.sampler import Monitor
from torchlens.frontends.server.stream import Broadcaster, kernel_pids

TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX


class GrowingNvml(FakeNvml):
    """NVLink counters move 50 MiB (tx) / 10 MiB (rx) per read; processes are the kernels."""

    def __init__(self, devices: list[dict[str, Any]], settings: dict[str, Any]):
        super().__init__(devices)
        self.settings = settings

    def nvmlDeviceGetFieldValues(
        self, handle: dict[str, Any], field_ids: list[Any]
    ) -> list[Any]:
        counters = handle["nvlink_kib"]
        if isinstance(counters, dict) and counters:  # {}: a GPU without NVLink
            counters[TX] += 50 * 1024
            counters[RX] += 10 * 1024
        return super().nvmlDeviceGetFieldValues(handle, field_ids)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: dict[str, Any]) -> list[Any]:
        if handle["uuid"] != "GPU-fake-0":
            return []
        pids = kernel_pids(self.settings)
        return [SimpleNamespace(pid=pid, usedGpuMemory=2**30) for pid in pids]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "fake_gpu_ext"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    settings = serverapp.web_app.settings
    # one driver for both, with memory info v2: the driver's reservation shown apart
    reserved = SimpleNamespace(used=10 * 2**30, total=40 * 2**30, free=29 * 2**30,
                               reserved=600 * 2**20)
    devices = [
        gpu("GPU-fake-0", nvlink_kib={TX: 0, RX: 0}, mem_v2=reserved),
        # no NVLink: the driver answers every NVLink field NOT_SUPPORTED
        gpu("GPU-fake-1", name="NVIDIA GeForce RTX 4090", nvlink_kib={}, mem_v2=reserved),
    ]
    # two GPU models and no CUDA_DEVICE_ORDER: CUDA's ordinals cannot be mapped
    monitor = Monitor(
        HostSampler(),
        NvmlSampler(api=GrowingNvml(devices, settings), environ={}, nested_pids=False),
        interval=0.5,
    )
    settings["torchlens_monitor"] = monitor
    settings["torchlens_broadcaster"] = Broadcaster(monitor, settings)
    monitor.start(IOLoop.current())
