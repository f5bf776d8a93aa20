"""A fake of exactly the pynvml functions torchlens calls, raising pynvml's real errors.

Each fake device is a dict of metric values; a value that is an exception class
is raised instead (e.g. ``pynvml.NVMLError_NotSupported``), which is what real
drivers do for metrics a card or a MIG slice lacks.

``nvmlDeviceGetPcieThroughput`` is counted (``pcie_calls``): the real call
blocks for NVML's 20 ms sampling window, so how often it runs is what costs.

NVLink counters (``nvlink_kib``: field id -> cumulative counter, KiB for
138/139, bytes for 202/204) follow
``nvmlDeviceGetFieldValues``: the call succeeds and each value carries its own
``nvmlReturn``; a field mapped to an ``NVML_ERROR_*`` code (int wrapped in
``FieldError``) comes back with that code, as real drivers answer for GPUs
without NVLink.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml


class FieldError(int):
    """An ``nvmlReturn`` code for one field of ``nvmlDeviceGetFieldValues``."""


def gpu(
    uuid: str, name: str = "NVIDIA A100-SXM4-40GB", **overrides: Any
) -> dict[str, Any]:
    """A healthy device; override any metric with a value or an NVML error class."""
    dev: dict[str, Any] = {
        "uuid": uuid,
        "name": name,
        "util": SimpleNamespace(gpu=42, memory=17),
        "mem": SimpleNamespace(used=10 * 2**30, total=40 * 2**30, free=30 * 2**30),
        "temp": 55,
        "power_mw": 250_000,
        "limit_mw": 400_000,
        "pcie_kb": {
            pynvml.NVML_PCIE_UTIL_TX_BYTES: 1000,
            pynvml.NVML_PCIE_UTIL_RX_BYTES: 2000,
        },
        "nvlink_kib": {
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 5000,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 7000,
        },
        "compute": [SimpleNamespace(pid=1234, usedGpuMemory=2 * 2**30)],
        "graphics": [],
        "mig_mode": pynvml.NVMLError_NotSupported,
        "mig": [],
    }
    dev.update(overrides)
    return dev


class FakeNvml:
    """Stands in for the ``pynvml`` module (only the functions in ``NVML_FUNCTIONS``)."""

    def __init__(
        self,
        devices: list[dict[str, Any]] | None = None,
        init_error: type | None = None,
    ):
        self.devices = devices or []
        self.init_error = init_error
        self.calls: list[str] = []
        self.shutdown_called = False
        self.pcie_calls = 0

    def _value(self, handle: dict[str, Any], key: str) -> Any:
        value = handle[key]
        if isinstance(value, type) and issubclass(value, pynvml.NVMLError):
            raise value()
        return value

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        self.shutdown_called = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self.devices[index]

    def nvmlDeviceGetUUID(self, handle: dict[str, Any]) -> str:
        return handle["uuid"]

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> bytes:
        return handle["name"].encode()  # older bindings return bytes

    def nvmlDeviceGetMigMode(self, handle: dict[str, Any]) -> list[int]:
        return self._value(handle, "mig_mode")

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: dict[str, Any]) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(
        self, handle: dict[str, Any], index: int
    ) -> dict[str, Any]:
        if index >= len(handle["mig"]):
            raise pynvml.NVMLError_NotFound()
        return handle["mig"][index]

    def nvmlDeviceGetUtilizationRates(self, handle: dict[str, Any]) -> Any:
        return self._value(handle, "util")

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any], version: int | None = None) -> Any:
        """As pynvml: version 1 by default (``used`` = total - free, the driver's
        reservation included); ``version=nvmlMemory_v2`` reports it apart,
        where the device has a ``mem_v2`` entry (else the driver refuses)."""
        if version is None:
            return self._value(handle, "mem")
        if "mem_v2" not in handle:
            raise pynvml.NVMLError_FunctionNotFound()
        return self._value(handle, "mem_v2")

    def nvmlDeviceGetTemperature(self, handle: dict[str, Any], sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._value(handle, "temp")

    def nvmlDeviceGetPowerUsage(self, handle: dict[str, Any]) -> int:
        return self._value(handle, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: dict[str, Any]) -> int:
        return self._value(handle, "limit_mw")

    def nvmlDeviceGetPcieThroughput(self, handle: dict[str, Any], counter: int) -> int:
        self.pcie_calls += 1
        return self._value(handle, "pcie_kb")[counter]

    def nvmlDeviceGetFieldValues(
        self, handle: dict[str, Any], field_ids: list[Any]
    ) -> list[Any]:
        """Values shaped like pynvml's ``c_nvmlFieldValue_t`` (``fieldId``, ``nvmlReturn``, ``value.ullVal``)."""
        counters = self._value(handle, "nvlink_kib")
        out = []
        for item in field_ids:
            field, scope = item if isinstance(item, tuple) else (item, 0)
            value = counters.get(field, FieldError(pynvml.NVML_ERROR_NOT_SUPPORTED))
            failed = isinstance(value, FieldError)
            out.append(
                SimpleNamespace(
                    fieldId=field,
                    scopeId=scope,
                    nvmlReturn=int(value) if failed else pynvml.NVML_SUCCESS,
                    value=SimpleNamespace(ullVal=0 if failed else value),
                )
            )
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: dict[str, Any]) -> list[Any]:
        return self._value(handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(
        self, handle: dict[str, Any]
    ) -> list[Any]:
        return self._value(handle, "graphics")
