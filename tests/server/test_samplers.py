"""NVML and host samplers: no-GPU status, per-metric n/a, CUDA ordinal mapping, MIG."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pynvml
import pytest
from fake_nvml import FakeNvml, FieldError, gpu

from torchlens.capture.monitor.gpu import NVML_FUNCTIONS, NvmlSampler, cuda_ordinals
from torchlens.capture.monitor.host import HostSampler
from torchlens.model.samples import GpuDevice


def read(s: NvmlSampler | HostSampler) -> Any:
    """One sample as the JSON the page gets."""
    return msgspec.to_builtins(s.sample())


def sampler(fake: FakeNvml, **env: str) -> NvmlSampler:
    return NvmlSampler(api=fake, environ=env, process_name=lambda pid: f"proc{pid}",
                       nested_pids=False)


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
    out = read(s)
    assert out["available"] is False and out["gpus"] == []
    assert out["status"].startswith("no NVIDIA GPU found (") and reason in out["status"]
    s.close()


def test_this_machine_without_gpu_says_so() -> None:
    out = read(NvmlSampler())  # real pynvml; CI has no NVIDIA driver
    if out["available"]:
        pytest.skip("this machine has an NVIDIA driver")
    assert out["status"].startswith("no NVIDIA GPU found (")


def test_zero_devices() -> None:
    assert "reports no devices" in sampler(FakeNvml([])).status


def test_full_sample_units() -> None:
    fake = FakeNvml([gpu("GPU-aaa")])
    out = read(sampler(fake))
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
    g = read(sampler(FakeNvml([dev])))["gpus"][0]
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
    first = read(s)["gpus"][0]
    assert first["nvlink_tx_bps"] is None and first["nvlink_rx_bps"] is None
    clock.now += 2.0
    dev["nvlink_kib"] = {TX: 1000 + 2 * 500_000, RX: 4000 + 2 * 250}
    g = read(s)["gpus"][0]
    assert g["nvlink_tx_bps"] == 500_000 * 1024 and g["nvlink_rx_bps"] == 250 * 1024
    clock.now += 1.0
    dev["nvlink_kib"] = {TX: 10, RX: 4000 + 2 * 250}  # tx counter reset: no rate
    g = read(s)["gpus"][0]
    assert g["nvlink_tx_bps"] is None and g["nvlink_rx_bps"] == 0.0
    clock.now += 1.0
    # and from the reset on, rates again
    dev["nvlink_kib"] = {TX: 10 + 100, RX: 4000 + 2 * 250}
    assert read(s)["gpus"][0]["nvlink_tx_bps"] == 100 * 1024


def test_nvlink_not_supported_per_field_or_whole_call_is_none() -> None:
    ns = FieldError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    per_field = gpu("GPU-aaa", nvlink_kib={TX: ns, RX: 100})
    whole_call = gpu("GPU-bbb", nvlink_kib=pynvml.NVMLError_NotSupported)
    clock = Clock()
    s = NvmlSampler(api=FakeNvml([per_field, whole_call]), environ={}, clock=clock)
    read(s)
    clock.now += 1.0
    per_field["nvlink_kib"] = {TX: ns, RX: 200}
    a, b = read(s)["gpus"]
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
    procs = read(sampler(FakeNvml([dev])))["gpus"][0]["processes"]
    assert procs == [
        {"pid": 1, "name": "proc1", "mem_used": 5},
        {"pid": 2, "name": "proc2", "mem_used": None},
    ]


def test_cuda_visible_devices_reorders_by_uuid() -> None:
    fake = FakeNvml([gpu("GPU-aaa"), gpu("GPU-bbb"), gpu("GPU-ccc")])
    s = sampler(fake, CUDA_VISIBLE_DEVICES="2,0")
    cuda = {g["uuid"]: g["cuda"] for g in read(s)["gpus"]}
    assert cuda == {"GPU-aaa": 1, "GPU-bbb": None, "GPU-ccc": 0}
    s = sampler(fake, CUDA_VISIBLE_DEVICES="GPU-bb,GPU-a")  # unique UUID prefixes
    assert {g["uuid"]: g["cuda"] for g in read(s)["gpus"]}["GPU-bbb"] == 0


def test_cuda_visible_devices_stops_at_first_invalid_entry() -> None:
    devices = [GpuDevice(index=i, uuid=f"GPU-{i}", mig_parent=None) for i in range(3)]
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
    gpus = read(s)["gpus"]
    assert [g["uuid"] for g in gpus] == ["GPU-aaa", "MIG-0", "MIG-1"]
    assert [g["mig_parent"] for g in gpus] == [None, 0, 0]
    assert [g["cuda"] for g in gpus] == [None, None, 0]
    assert gpus[1]["util_gpu"] is None and gpus[1]["mem_used"] == 10 * 2**30


def test_nvml_starts_once_per_process_and_close_leaves_it_running() -> None:
    """nvmlInit can take hundreds of ms: a second sampler (or capture) reuses it."""
    fake = FakeNvml([gpu("GPU-aaa")])
    s = sampler(fake)
    s.close()
    s.close()
    assert not fake.shutdown_called and s.available is False
    again = sampler(fake)
    assert again.available and fake.calls.count("nvmlInit") == 1
    # a failed start is remembered, and said again each time
    broken = FakeNvml(init_error=pynvml.NVMLError_DriverNotLoaded)
    for _ in range(2):
        assert "NVIDIA driver not loaded" in sampler(broken).status
    assert broken.calls.count("nvmlInit") == 1


def test_host_sampler_reads_cpu_and_ram() -> None:
    h = HostSampler()
    out = read(h)
    assert 0 <= out["cpu_percent"] <= 100 and out["cpu_count"] >= 1
    assert 0 < out["ram_used"] <= out["ram_total"] and 0 <= out["ram_percent"] <= 100


# ------------------------------------------------------ GPU numbering and names
def test_cuda_ordinals_follow_cuda_device_order_on_mixed_gpus() -> None:
    """NVML numbers GPUs by PCI bus; CUDA's default FASTEST_FIRST puts the faster
    first: on mixed models an index is not mapped, and the user is told why."""
    fake = FakeNvml([gpu("GPU-aaa", name="NVIDIA A100-SXM4-40GB"),
                     gpu("GPU-bbb", name="NVIDIA H100 80GB HBM3")])
    s = sampler(fake)
    gpus = read(s)["gpus"]
    assert [g["cuda"] for g in gpus] == [None, None]
    assert "FASTEST_FIRST" in gpus[0]["cuda_note"] and "PCI_BUS_ID" in s.status
    s = sampler(fake, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert [g["cuda"] for g in read(s)["gpus"]] == [0, 1]
    assert read(s)["gpus"][0]["cuda_note"] is None
    # UUIDs in CUDA_VISIBLE_DEVICES need no order: the list's order is CUDA's
    s = sampler(fake, CUDA_VISIBLE_DEVICES="GPU-bbb,GPU-aaa")
    assert {g["uuid"]: g["cuda"] for g in read(s)["gpus"]} == {"GPU-aaa": 1, "GPU-bbb": 0}
    assert "CUDA_VISIBLE_DEVICES=GPU-bbb,GPU-aaa" in s.status
    s = sampler(fake, CUDA_VISIBLE_DEVICES="1,0")
    assert [g["cuda"] for g in read(s)["gpus"]] == [None, None]


def test_same_model_gpus_map_by_index_under_the_default_order() -> None:
    fake = FakeNvml([gpu("GPU-aaa"), gpu("GPU-bbb")])
    assert [g["cuda"] for g in read(sampler(fake, CUDA_VISIBLE_DEVICES="1"))["gpus"]] == [
        None, 0]


def test_mig_without_visible_uuids_maps_nothing_and_says_why() -> None:
    ns = pynvml.NVMLError_NotSupported
    slices = [gpu(f"MIG-{k}", name="A100 MIG 3g.20gb", mig_mode=ns) for k in range(2)]
    other = gpu("GPU-bbb")
    parent = gpu("GPU-aaa", mig_mode=[pynvml.NVML_DEVICE_MIG_ENABLE, 1], mig=slices)
    s = sampler(FakeNvml([parent, other]))
    gpus = read(s)["gpus"]
    assert [g["cuda"] for g in gpus] == [None, None, None, None]
    assert "MIG is on" in s.status and gpus[0]["mig"] is True


def test_pcie_is_read_on_its_own_slower_cadence() -> None:
    fake = FakeNvml([gpu(f"GPU-{k}") for k in range(8)])
    clock = Clock()
    s = NvmlSampler(api=fake, environ={}, clock=clock, pcie_interval=5.0, nested_pids=False)
    for _ in range(10):  # one second at the 0.1 s shortest interval
        g = read(s)["gpus"][0]
        clock.now += 0.1
    assert fake.pcie_calls == 16  # tx and rx once per GPU, not 160 x 20 ms
    assert g["pcie_tx_bps"] == 1000 * 1024 and g["pcie_age_s"] == pytest.approx(0.9)
    clock.now += 5.0
    read(s)
    assert fake.pcie_calls == 32


def test_nvlink_falls_back_to_fields_202_204_and_says_what_was_not_read() -> None:
    ns = FieldError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    xmit, rcv = (pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES,
                 pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES)
    assert (xmit, rcv) == (202, 204)
    newer = gpu("GPU-aaa", nvlink_kib={TX: ns, RX: ns, xmit: 10_000, rcv: 0})
    none = gpu("GPU-bbb", nvlink_kib={TX: ns, RX: ns, xmit: ns, rcv: ns})
    clock = Clock()
    s = NvmlSampler(api=FakeNvml([newer, none]), environ={}, clock=clock, nested_pids=False)
    read(s)
    clock.now += 2.0
    newer["nvlink_kib"] = {TX: ns, RX: ns, xmit: 10_000 + 2 * 3_000_000, rcv: 0}
    a, b = read(s)["gpus"]
    assert a["nvlink_tx_bps"] == 3_000_000 and a["nvlink_rx_bps"] == 0.0  # bytes, not KiB
    assert "nvlink_tx_bps" not in a["not_read"]
    assert b["nvlink_tx_bps"] is None
    assert b["not_read"]["nvlink_tx_bps"] == (
        "field 138: NVML_ERROR_NOT_SUPPORTED; field 202: NVML_ERROR_NOT_SUPPORTED")


def test_a_metric_nvml_refuses_is_named_in_not_read() -> None:
    dev = gpu("GPU-aaa", util=pynvml.NVMLError_NotSupported, power_mw=pynvml.NVMLError_NoPermission)
    g = read(sampler(FakeNvml([dev])))["gpus"][0]
    assert g["util_gpu"] is None and g["not_read"]["util_gpu"] == "NVMLError_NotSupported"
    assert g["not_read"]["power_w"] == "NVMLError_NoPermission"
    assert g["mem_used"] == 10 * 2**30 and "mem_used" not in g["not_read"]


def test_in_a_container_nvml_pids_are_the_hosts_and_are_not_named() -> None:
    asked: list[int] = []

    def name(pid: int) -> str:
        asked.append(pid)
        return "python"

    s = NvmlSampler(api=FakeNvml([gpu("GPU-aaa")]), environ={}, process_name=name,
                    nested_pids=True)
    out = read(s)
    assert out["pids"] == "host" and asked == []
    assert out["gpus"][0]["processes"] == [{"pid": 1234, "name": None, "mem_used": 2 * 2**30}]
    local = read(NvmlSampler(api=FakeNvml([gpu("GPU-aaa")]), environ={}, process_name=name,
                        nested_pids=False))
    assert local["pids"] == "local" and asked == [1234]


def test_nested_pid_namespace_reads_nspid(tmp_path, monkeypatch) -> None:
    from torchlens.capture.monitor import gpu as gpu_module

    status = tmp_path / "status"
    monkeypatch.setattr(gpu_module, "Path", lambda _: status)
    status.write_text("Name:\tpython\nNSpid:\t4242\t17\n")
    assert gpu_module._nested_pid_namespace() is True
    status.write_text("Name:\tpython\nNSpid:\t4242\n")
    assert gpu_module._nested_pid_namespace() is False


def test_a_rocm_build_says_so_instead_of_no_nvidia_gpu() -> None:
    s = NvmlSampler(api=FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound), environ={},
                    hip="6.2.41133", nested_pids=False)
    out = read(s)
    assert out["available"] is False
    assert out["status"].startswith("ROCm build (HIP 6.2.41133), NVML not available")
    assert "no NVIDIA GPU found" not in out["status"]


def test_rocm_build_is_read_from_torch_or_its_version_file(tmp_path, monkeypatch) -> None:
    """The server's sampler tells a ROCm build without importing torch."""
    import importlib.util
    import sys
    from types import SimpleNamespace

    from torchlens.capture.monitor import nvml

    monkeypatch.setitem(sys.modules, "torch",
                        SimpleNamespace(version=SimpleNamespace(hip="6.2.41133")))
    assert nvml.rocm_build() == "6.2.41133"
    monkeypatch.delitem(sys.modules, "torch")
    (tmp_path / "version.py").write_text(
        "from typing import Optional\ncuda: Optional[str] = None\nhip: Optional[str] = '6.4.1'\n")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: SimpleNamespace(submodule_search_locations=[str(tmp_path)]))
    assert nvml.rocm_build() == "6.4.1"
    (tmp_path / "version.py").write_text("hip: Optional[str] = None\n")
    assert nvml.rocm_build() is None


def test_memory_used_is_what_nvidia_smi_shows_not_the_drivers_reservation() -> None:
    """Figures an H200 gave (driver 580): NVML v1 said 3,726 MiB used where
    nvidia-smi said 3,111 MiB; v2 reports the driver's 615 MiB apart."""
    from types import SimpleNamespace

    mib = 2**20
    dev = gpu("GPU-a", mem=SimpleNamespace(used=3726 * mib, total=143771 * mib, free=140045 * mib),
              mem_v2=SimpleNamespace(used=3111 * mib, reserved=615 * mib, total=143771 * mib,
                                     free=140045 * mib))
    g = read(sampler(FakeNvml([dev])))["gpus"][0]
    assert g["mem_used"] == 3111 * mib and g["mem_reserved"] == 615 * mib
    assert "mem_reserved" not in g["not_read"]
    # a driver without version 2: version 1's figure, and the sample says what it includes
    old = read(sampler(FakeNvml([gpu("GPU-a", mem=dev["mem"])])))["gpus"][0]
    assert old["mem_used"] == 3726 * mib and old["mem_reserved"] is None
    assert "includes the driver's reserved memory" in old["not_read"]["mem_reserved"]
