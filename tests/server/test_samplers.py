"""NVML and host samplers: no-GPU status, per-metric n/a, CUDA ordinal mapping, MIG."""

from __future__ import annotations

import time

import pynvml
import pytest
from fake_nvml import FakeNvml, FieldError, gpu

from torchlens.capture.monitor.gpu import NVML_FUNCTIONS, NvmlSampler, cuda_ordinals
from torchlens.capture.monitor.host import HostSampler


def sampler(fake: FakeNvml, **env: str) -> NvmlSampler:
    return NvmlSampler(api=fake, environ=env, process_name=lambda pid: f"proc{pid}")


def test_fake_has_exactly_the_functions_the_sampler_calls() -> None:
    fake_api = {n for n in vars(FakeNvml) if n.startswith("nvml")}
    assert fake_api == set(NVML_FUNCTIONS)
    assert all(hasattr(pynvml, n) for n in NVML_FUNCTIONS)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (pynvml.NVMLError_LibraryNotFound, "NVML library not found"),
        (pynvml.NVMLError_DriverNotLoaded, "NVIDIA driver not loaded"),
        (pynvml.NVMLError_NoPermission, "no permission"),
    ],
)
def test_init_failure_is_a_status_not_an_error(error: type, reason: str) -> None:
    s = sampler(FakeNvml(init_error=error))
    out = s.sample()
    assert out["available"] is False and out["gpus"] == []
    assert out["status"].startswith("no NVIDIA GPU found (") and reason in out["status"]
    s.close()


def test_this_machine_without_gpu_says_so() -> None:
    out = NvmlSampler().sample()  # real pynvml; CI has no NVIDIA driver
    if out["available"]:
        pytest.skip("this machine has an NVIDIA driver")
    assert out["status"].startswith("no NVIDIA GPU found (")


def test_zero_devices() -> None:
    assert "reports no devices" in sampler(FakeNvml([])).status


def test_full_sample_units() -> None:
    fake = FakeNvml([gpu("GPU-aaa")])
    out = sampler(fake).sample()
    g = out["gpus"][0]
    assert out["available"] and out["driver"] == "550.54.15"
    assert g["name"] == "NVIDIA A100-SXM4-40GB" and g["cuda"] == 0
    assert (g["util_gpu"], g["util_mem"]) == (42, 17)
    assert g["mem_used"] == 10 * 2**30 and g["mem_total"] == 40 * 2**30
    assert (g["temp_c"], g["power_w"], g["power_limit_w"]) == (55, 250.0, 400.0)
    assert (g["pcie_tx_bps"], g["pcie_rx_bps"]) == (1000 * 1024, 2000 * 1024)
    assert g["processes"] == [{"pid": 1234, "name": "proc1234", "mem_used": 2 * 2**30}]
    assert abs(out["t"] - time.time()) < 5


def test_each_unsupported_metric_is_none_and_the_rest_still_read() -> None:
    ns = pynvml.NVMLError_NotSupported
    dev = gpu(
        "GPU-aaa",
        temp=ns,
        power_mw=ns,
        limit_mw=pynvml.NVMLError_NoPermission,
        pcie_kb=ns,
        graphics=ns,
    )
    g = sampler(FakeNvml([dev])).sample()["gpus"][0]
    assert g["temp_c"] is None and g["power_w"] is None and g["power_limit_w"] is None
    assert g["pcie_tx_bps"] is None and g["pcie_rx_bps"] is None
    assert g["util_gpu"] == 42 and len(g["processes"]) == 1


TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_nvlink_field_ids_are_the_installed_pynvml_ones() -> None:
    assert (TX, RX) == (138, 139)  # KiB counters summed over links (scope UINT_MAX)


def test_nvlink_rate_from_two_samples_and_counter_reset() -> None:
    dev = gpu("GPU-aaa", nvlink_kib={TX: 1000, RX: 4000})
    clock = Clock()
    s = NvmlSampler(api=FakeNvml([dev]), environ={}, clock=clock)
    first = s.sample()["gpus"][0]
    assert first["nvlink_tx_bps"] is None and first["nvlink_rx_bps"] is None
    clock.now += 2.0
    dev["nvlink_kib"] = {TX: 1000 + 2 * 500_000, RX: 4000 + 2 * 250}
    g = s.sample()["gpus"][0]
    assert g["nvlink_tx_bps"] == 500_000 * 1024 and g["nvlink_rx_bps"] == 250 * 1024
    clock.now += 1.0
    dev["nvlink_kib"] = {TX: 10, RX: 4000 + 2 * 250}  # tx counter reset: no rate
    g = s.sample()["gpus"][0]
    assert g["nvlink_tx_bps"] is None and g["nvlink_rx_bps"] == 0.0
    clock.now += 1.0
    # and from the reset on, rates again
    dev["nvlink_kib"] = {TX: 10 + 100, RX: 4000 + 2 * 250}
    assert s.sample()["gpus"][0]["nvlink_tx_bps"] == 100 * 1024


def test_nvlink_not_supported_per_field_or_whole_call_is_none() -> None:
    ns = FieldError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    per_field = gpu("GPU-aaa", nvlink_kib={TX: ns, RX: 100})
    whole_call = gpu("GPU-bbb", nvlink_kib=pynvml.NVMLError_NotSupported)
    clock = Clock()
    s = NvmlSampler(api=FakeNvml([per_field, whole_call]), environ={}, clock=clock)
    s.sample()
    clock.now += 1.0
    per_field["nvlink_kib"] = {TX: ns, RX: 200}
    a, b = s.sample()["gpus"]
    assert a["nvlink_tx_bps"] is None and a["nvlink_rx_bps"] == 100 * 1024
    assert b["nvlink_tx_bps"] is None and b["nvlink_rx_bps"] is None
    # the rest of the device is still read
    assert b["util_gpu"] == 42 and b["pcie_tx_bps"] == 1000 * 1024


def test_processes_merge_compute_and_graphics_and_missing_memory() -> None:
    from types import SimpleNamespace as P

    dev = gpu(
        "GPU-aaa",
        compute=[P(pid=1, usedGpuMemory=None)],
        graphics=[P(pid=1, usedGpuMemory=5), P(pid=2, usedGpuMemory=None)],
    )
    procs = sampler(FakeNvml([dev])).sample()["gpus"][0]["processes"]
    assert procs == [
        {"pid": 1, "name": "proc1", "mem_used": 5},
        {"pid": 2, "name": "proc2", "mem_used": None},
    ]


def test_cuda_visible_devices_reorders_by_uuid() -> None:
    fake = FakeNvml([gpu("GPU-aaa"), gpu("GPU-bbb"), gpu("GPU-ccc")])
    s = sampler(fake, CUDA_VISIBLE_DEVICES="2,0")
    cuda = {g["uuid"]: g["cuda"] for g in s.sample()["gpus"]}
    assert cuda == {"GPU-aaa": 1, "GPU-bbb": None, "GPU-ccc": 0}
    s = sampler(fake, CUDA_VISIBLE_DEVICES="GPU-bb,GPU-a")  # unique UUID prefixes
    assert {g["uuid"]: g["cuda"] for g in s.sample()["gpus"]}["GPU-bbb"] == 0


def test_cuda_visible_devices_stops_at_first_invalid_entry() -> None:
    devices = [{"index": i, "uuid": f"GPU-{i}", "mig_parent": None} for i in range(3)]
    assert cuda_ordinals(devices, {"CUDA_VISIBLE_DEVICES": "1,7,0"}) == {"GPU-1": 0}
    assert cuda_ordinals(devices, {"CUDA_VISIBLE_DEVICES": ""}) == {}
    assert cuda_ordinals(devices, {}) == {"GPU-0": 0, "GPU-1": 1, "GPU-2": 2}


def test_mig_slices_are_listed_and_addressable_by_uuid() -> None:
    ns = pynvml.NVMLError_NotSupported
    slices = [
        gpu(f"MIG-{k}", name="A100 MIG 3g.20gb", util=ns, mig_mode=ns) for k in range(2)
    ]
    parent = gpu("GPU-aaa", mig_mode=[pynvml.NVML_DEVICE_MIG_ENABLE, 1], mig=slices)
    s = sampler(FakeNvml([parent]), CUDA_VISIBLE_DEVICES="MIG-1")
    gpus = s.sample()["gpus"]
    assert [g["uuid"] for g in gpus] == ["GPU-aaa", "MIG-0", "MIG-1"]
    assert [g["mig_parent"] for g in gpus] == [None, 0, 0]
    assert [g["cuda"] for g in gpus] == [None, None, 0]
    assert gpus[1]["util_gpu"] is None and gpus[1]["mem_used"] == 10 * 2**30


def test_close_shuts_nvml_down_once() -> None:
    fake = FakeNvml([gpu("GPU-aaa")])
    s = sampler(fake)
    s.close()
    s.close()
    assert fake.shutdown_called


def test_host_sampler_reads_cpu_and_ram() -> None:
    h = HostSampler()
    out = h.sample()
    assert 0 <= out["cpu_percent"] <= 100 and out["cpu_count"] >= 1
    assert 0 < out["ram_used"] <= out["ram_total"] and 0 <= out["ram_percent"] <= 100
