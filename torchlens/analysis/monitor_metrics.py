"""The GPU and host series the Jupyter server adds to its own ``/metrics`` (docs/METRICS.md).

Pure: one sample of the sidebar's sampler (``frontends.monitor.sampler.Monitor``:
``{"t", "host": HostSampler's, "gpu": NvmlSampler's}``) -> metric families,
named as DCGM exporter users expect them, in base units (bytes, watts,
ratios, degrees Celsius, bytes per second). Labels: ``host`` (this machine)
and ``gpu`` (the NVML index, ``<index>-mig<slot>`` for a MIG slice); no
process, path or user string. A value the sampler could not read is absent.
"""

from __future__ import annotations

from torchlens.analysis.ranks.metrics import Family
from torchlens.model.samples import GpuReading, MachineSample

#: (series, sample key, scale, help); the DCGM field each mirrors is in docs/METRICS.md
GPU_SERIES = (
    ("torchlens_gpu_utilization_ratio", "util_gpu", 0.01,
     "Share of the last sample period a kernel ran on the GPU (NVML)"),
    ("torchlens_gpu_memory_copy_utilization_ratio", "util_mem", 0.01,
     "Share of the last sample period device memory was read or written (NVML)"),
    ("torchlens_gpu_memory_used_bytes", "mem_used", 1, "Device memory in use, as nvidia-smi shows it"),
    ("torchlens_gpu_memory_total_bytes", "mem_total", 1, "Device memory"),
    ("torchlens_gpu_temperature_celsius", "temp_c", 1, "GPU temperature"),
    ("torchlens_gpu_power_watts", "power_w", 1, "Power draw"),
    ("torchlens_gpu_power_limit_watts", "power_limit_w", 1, "Enforced power limit"),
    ("torchlens_gpu_pcie_tx_bytes_per_second", "pcie_tx_bps", 1, "PCIe bytes sent per second"),
    ("torchlens_gpu_pcie_rx_bytes_per_second", "pcie_rx_bps", 1, "PCIe bytes received per second"),
    ("torchlens_gpu_nvlink_tx_bytes_per_second", "nvlink_tx_bps", 1,
     "NVLink bytes sent per second (all links)"),
    ("torchlens_gpu_nvlink_rx_bytes_per_second", "nvlink_rx_bps", 1,
     "NVLink bytes received per second (all links)"),
)
HOST_SERIES = (
    ("torchlens_host_cpu_utilization_ratio", "cpu_percent", 0.01, "CPU busy share, all cores"),
    ("torchlens_host_memory_used_bytes", "ram_used", 1, "RAM in use (total - available)"),
    ("torchlens_host_memory_total_bytes", "ram_total", 1, "RAM"),
    ("torchlens_host_load1", "load1", 1, "One-minute load average"),
)


def gpu_label(gpu: GpuReading) -> str:
    slot = f"-mig{gpu.mig_slot}" if gpu.mig_parent is not None else ""
    return f"{gpu.index}{slot}"


def machine_families(sample: MachineSample | None, host: str, now: float) -> list[Family]:
    """The series of one sample; ``now`` (unix seconds) gives its age."""
    age = Family("torchlens_monitor_sample_age_seconds", "gauge",
                 "Seconds since the sampler's newest sample (it slows down when nobody watches)")
    gpus = Family("torchlens_gpu_count", "gauge", "GPUs (and MIG slices) the sampler reads")
    out = [age, gpus]
    if sample is None:
        return out
    labels = {"host": host}
    age.add(labels, max(0.0, now - float(sample.t)))
    devices = sample.gpu.gpus
    gpus.add(labels, len(devices))
    for name, key, scale, text in GPU_SERIES:
        family = Family(name, "gauge", text)
        for dev in devices:
            value = getattr(dev, key)
            if isinstance(value, (int, float)):
                family.add({**labels, "gpu": gpu_label(dev)}, value * scale)
        out.append(family)
    machine = sample.host
    for name, key, scale, text in HOST_SERIES:
        family = Family(name, "gauge", text)
        value = getattr(machine, key)
        if isinstance(value, (int, float)):
            family.add(labels, value * scale)
        out.append(family)
    return out
