"""What the GPU/host monitor samples: typed once where a sampler reads them.

The host sampler (``capture.monitor.host``) and the NVML sampler
(``capture.monitor.gpu``) each return one of these structs; the server's
monitor (``frontends.monitor.sampler``) keeps them in its history with the
per-rank memory samples kernels post, and the page, the Prometheus
collector and ``%gpumonitor`` read the same structs. They leave as JSON
(``msgspec.to_builtins``) in the shape the page has always read: field
order is key order, and a field that is ``UNSET`` (a process no kernel
tag has been given, a rank sample that is not a report's) is left out.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType


class HostSample(msgspec.Struct):
    """One reading of the machine: CPU busy percent (None until one was
    measured), RAM bytes and percent, one-minute load (None on Windows)."""

    t: float
    cpu_percent: float | None = None
    cpu_count: int | None = None
    ram_used: int | None = None
    ram_total: int | None = None
    ram_percent: float | None = None
    load1: float | None = None


class GpuProcess(msgspec.Struct):
    """A process on a GPU: its pid (the host's in a container), name (None
    when not named) and the device memory it holds. ``kernel`` and
    ``kernel_child`` are set by the server on the newest sample: which of its
    kernels it is, or was started by."""

    pid: int
    name: str | None = None
    mem_used: int | None = None
    kernel: str | None | UnsetType = UNSET
    kernel_child: bool | UnsetType = UNSET


class GpuDevice(msgspec.Struct):
    """A GPU or MIG slice as the sampler enumerated it: NVML index, its
    parent and slot when a MIG slice, UUID, name, and its CUDA ordinal as the
    server's process sees it (None, with why in ``cuda_note``)."""

    index: int
    mig_parent: int | None = None
    mig_slot: int | None = None
    mig: bool = False
    uuid: str = ""
    name: str = "n/a"
    cuda: int | None = None
    cuda_note: str | None = None


class GpuReading(GpuDevice):
    """One device's figures in a sample: None where NVML would not give it,
    with why in ``not_read`` (metric -> NVML error)."""

    util_gpu: int | None = None
    util_mem: int | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    #: the driver's own reservation (memory info v2 only): not in mem_used
    mem_reserved: int | None = None
    temp_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    pcie_tx_bps: float | None = None
    pcie_rx_bps: float | None = None
    #: seconds since PCIe was read (it is read every few seconds: the read blocks)
    pcie_age_s: float | None = None
    nvlink_tx_bps: float | None = None
    nvlink_rx_bps: float | None = None
    processes: list[GpuProcess] = []
    not_read: dict[str, str] = {}


class GpuSample(msgspec.Struct):
    """One reading of every device. ``available``: NVML started; ``status``
    the line the page shows; ``pids`` ``"host"`` when NVML's pids are not this
    machine's view (a container), else ``"local"``; ``pids_note`` says so on
    the newest sample the server sends."""

    t: float
    available: bool = False
    status: str = ""
    driver: str | None = None
    pids: str = "local"
    gpus: list[GpuReading] = []
    pids_note: str | UnsetType = UNSET


class MachineSample(msgspec.Struct):
    """The monitor's combined sample: host and GPUs at ``t``."""

    t: float
    host: HostSample
    gpu: GpuSample


class PostedSample(msgspec.Struct, kw_only=True):
    """One rank's memory as a kernel posts it to the server's monitor (which
    checks it: ``frontends.monitor.sampler.rank_sample``): allocated bytes
    (the resident set where ``source`` is ``rss``), and where a step record
    or summary gave them, the allocator's fragmentation figures and whose
    figures they are. A finished ``%%gpumem`` cell's report figures carry
    ``peak`` and ``final``. A field left ``UNSET`` is not sent."""

    rank: int
    t: float
    device: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    inactive_split: int | None | UnsetType = UNSET
    largest_free: int | None | UnsetType = UNSET
    source: str | None | UnsetType = UNSET
    peak: int | None | UnsetType = UNSET
    final: bool | UnsetType = UNSET


class RankSample(msgspec.Struct):
    """A rank's memory as a kernel posted it, checked (``sampler.rank_sample``):
    allocator bytes (``source`` says whose: cuda, modelled or rss). A finished
    ``%%gpumem`` cell's report figures carry ``final`` and ``peak``; a live
    sample leaves both out."""

    t: float
    run: str
    rank: int
    device: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    inactive_split: int | None = None
    largest_free: int | None = None
    source: str | None = None
    final: bool | UnsetType = UNSET
    peak: int | None | UnsetType = UNSET
