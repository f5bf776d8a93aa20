"""GPU sampler: one NVML reading per call, as a plain timestamped dict.

Why this shape: the monitor (server thread, ``%gpumonitor``) only needs "give
me a snapshot now", and tests must run on machines without a GPU. So the NVML
boundary is the handful of ``pynvml`` functions listed in ``NVML_FUNCTIONS``,
reached through an injectable ``api`` object (the real module by default, a
fake in tests); the error *classes* always come from the real ``pynvml``.

Rules the samplers follow, from how NVML (``nvidia-ml-py``'s ``pynvml``)
behaves: ``nvmlInit`` raises ``NVMLError_LibraryNotFound`` or
``NVMLError_DriverNotLoaded`` on a machine without a GPU, and any metric may
raise ``NVMLError_NotSupported`` (or ``NoPermission``) on a device that has a
driver:

* ``nvmlInit`` failing (no library, driver not loaded, ...) is not an error:
  the sampler reports ``available=False`` and a status line
  ``"no NVIDIA GPU found (reason)"`` that the UI shows verbatim.
* every metric is read on its own; any ``NVMLError`` (NotSupported on consumer
  cards and MIG slices, NoPermission in containers, ...) gives ``None``, which
  the UI shows as "n/a".
* NVLink throughput comes from NVML field values (cumulative KiB counters,
  summed over all links), so it is a rate only from the second sample on;
  a field the driver does not give (no NVLink, MIG slice, old driver) has
  its own non-zero ``nvmlReturn`` and is ``None`` like any other metric.
* CUDA ordinals are mapped to NVML devices by UUID, honouring
  ``CUDA_VISIBLE_DEVICES`` (which may list indices, GPU-/MIG- UUIDs or their
  unique prefixes), because CUDA and NVML number devices differently once that
  variable reorders or hides GPUs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import pynvml

#: The whole NVML surface torchlens touches; the test fake implements exactly these.
NVML_FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
)

#: NVLink counters read per sample: result key -> NVML field id (cumulative KiB).
NVLINK_FIELDS = (
    ("nvlink_tx_bps", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
    ("nvlink_rx_bps", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
)
#: ``scopeId`` UINT_MAX: NVML sums the throughput counter over all of a GPU's links.
ALL_LINKS = 0xFFFFFFFF


class Sampler(Protocol):
    """What the monitor needs from a sampler (GPU and host samplers both fit)."""

    def sample(self) -> dict[str, Any]:
        """Return one reading now: a plain dict with a ``t`` (epoch seconds) key."""
        ...

    def close(self) -> None:
        """Release the underlying library handles."""
        ...


def _text(value: Any) -> str:
    """NVML strings are bytes in older bindings and str in newer ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _init_failure_reason(err: Exception) -> str:
    """Say in words why NVML could not start, for the "no NVIDIA GPU found" line."""
    if isinstance(err, pynvml.NVMLError_LibraryNotFound):
        return "NVML library not found: no NVIDIA driver installed"
    if isinstance(err, pynvml.NVMLError_DriverNotLoaded):
        return "NVIDIA driver not loaded"
    if isinstance(err, pynvml.NVMLError_NoPermission):
        return "no permission to access the NVIDIA driver"
    return f"NVML init failed: {err}"


def cuda_ordinals(
    devices: list[dict[str, Any]], environ: Mapping[str, str] | None = None
) -> dict[str, int]:
    """Map NVML device UUIDs to the CUDA ordinals a process with ``environ`` sees.

    ``devices`` are dicts with ``index`` (NVML index), ``uuid`` and ``mig_parent``
    (None for a whole GPU). Without ``CUDA_VISIBLE_DEVICES`` CUDA sees the whole
    GPUs in order (assuming ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, NVML's order).
    With it, entry k of the list is ordinal k; CUDA stops at the first entry
    it cannot resolve, and so does this function.
    """
    env = os.environ if environ is None else environ
    whole = [d for d in devices if d.get("mig_parent") is None]
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return {d["uuid"]: k for k, d in enumerate(whole)}
    mapping: dict[str, int] = {}
    for ordinal, token in enumerate(t.strip() for t in visible.split(",")):
        match = _resolve_visible_token(token, devices, whole)
        if match is None or match["uuid"] in mapping:
            break
        mapping[match["uuid"]] = ordinal
    return mapping


def _resolve_visible_token(
    token: str, devices: list[dict[str, Any]], whole: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """One ``CUDA_VISIBLE_DEVICES`` entry -> device dict (index, or unique UUID prefix)."""
    if token.isdigit():
        index = int(token)
        return next((d for d in whole if d["index"] == index), None)
    if not token:
        return None
    hits = [d for d in devices if d["uuid"].startswith(token)]
    return hits[0] if len(hits) == 1 else None


class NvmlSampler:
    """Reads every visible NVIDIA GPU (and MIG slice) through NVML.

    ``api`` defaults to the ``pynvml`` module; pass a fake with the functions in
    ``NVML_FUNCTIONS`` to test. ``process_name`` turns a pid into a short name
    (psutil by default) so the UI can say which program holds the memory.
    """

    def __init__(
        self,
        api: Any = None,
        environ: Mapping[str, str] | None = None,
        process_name: Callable[[int], str | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = pynvml if api is None else api
        self._process_name = process_name or _psutil_process_name
        self._clock = clock  # monotonic: NVLink rates must not jump with the wall clock
        # uuid -> {key: (clock, KiB)}: the previous NVLink counters, to turn them into rates
        self._nvlink_prev: dict[str, dict[str, tuple[float, int]]] = {}
        self.available = False
        self.status = ""
        self.driver: str | None = None
        self.devices: list[dict[str, Any]] = []
        self._handles: dict[str, Any] = {}
        self._start(environ)

    def _start(self, environ: Mapping[str, str] | None) -> None:
        """Initialise NVML and enumerate devices once; failures become ``status``."""
        try:
            self._api.nvmlInit()
        except pynvml.NVMLError as err:
            self.status = f"no NVIDIA GPU found ({_init_failure_reason(err)})"
            return
        self.available = True
        self.driver = self._read(self._api.nvmlSystemGetDriverVersion)
        self.driver = None if self.driver is None else _text(self.driver)
        count = self._read(self._api.nvmlDeviceGetCount) or 0
        for index in range(count):
            self._enumerate(index)
        if not self.devices:
            self.status = "no NVIDIA GPU found (the driver reports no devices)"
            return
        ordinals = cuda_ordinals(self.devices, environ)
        for dev in self.devices:
            dev["cuda"] = ordinals.get(dev["uuid"])
        self.status = (
            f"{len(self.devices)} NVIDIA device(s), driver {self.driver or 'n/a'}"
        )

    def _enumerate(self, index: int) -> None:
        """Add GPU ``index`` and, when MIG mode is on, its MIG slices."""
        handle = self._read(self._api.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return
        self._add(handle, index, None)
        mode = self._read(self._api.nvmlDeviceGetMigMode, handle)
        if not mode or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            return
        slots = self._read(self._api.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        for slot in range(slots):
            mig = self._read(
                self._api.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot
            )
            if mig is not None:
                self._add(mig, index, index, slot)

    def _add(self, handle: Any, index: int, parent: int | None, slot: int = 0) -> None:
        uuid = self._read(self._api.nvmlDeviceGetUUID, handle)
        uuid = f"nvml-{index}-{slot}" if uuid is None else _text(uuid)
        name = self._read(self._api.nvmlDeviceGetName, handle)
        self._handles[uuid] = handle
        self.devices.append(
            {
                "index": index,
                "mig_parent": parent,
                "mig_slot": slot if parent is not None else None,
                "uuid": uuid,
                "name": "n/a" if name is None else _text(name),
            }
        )

    def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one NVML function; any NVML error means "not available" (None)."""
        try:
            return fn(*args)
        except pynvml.NVMLError:
            return None

    def sample(self) -> dict[str, Any]:
        """One reading of every device: utilization, memory, temperature, power, PCIe, NVLink, processes."""
        now = time.time()
        gpus = [self._sample_device(dev) for dev in self.devices]
        return {
            "t": now,
            "available": self.available,
            "status": self.status,
            "driver": self.driver,
            "gpus": gpus,
        }

    def _sample_device(self, dev: dict[str, Any]) -> dict[str, Any]:
        api, handle = self._api, self._handles[dev["uuid"]]
        util = self._read(api.nvmlDeviceGetUtilizationRates, handle)
        mem = self._read(api.nvmlDeviceGetMemoryInfo, handle)
        power = self._read(api.nvmlDeviceGetPowerUsage, handle)
        limit = self._read(api.nvmlDeviceGetEnforcedPowerLimit, handle)
        tx = self._read(
            api.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES
        )
        rx = self._read(
            api.nvmlDeviceGetPcieThroughput, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES
        )
        return {
            **dev,
            "util_gpu": None if util is None else util.gpu,
            "util_mem": None if util is None else util.memory,
            "mem_used": None if mem is None else mem.used,
            "mem_total": None if mem is None else mem.total,
            "temp_c": self._read(
                api.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
            ),
            "power_w": None if power is None else power / 1000.0,
            "power_limit_w": None if limit is None else limit / 1000.0,
            "pcie_tx_bps": None if tx is None else tx * 1024,  # NVML gives KB/s
            "pcie_rx_bps": None if rx is None else rx * 1024,
            **self._nvlink(dev["uuid"], handle),
            "processes": self._processes(handle),
        }

    def _nvlink(self, uuid: str, handle: Any) -> dict[str, float | None]:
        """NVLink tx/rx in bytes/s from the change of NVML's cumulative counters.

        Why counters and not a rate: NVML only exposes NVLink traffic as KiB
        totals, so a rate needs the previous sample (the first one is None).
        A counter that went down (reset by a driver reload or
        ``nvmlDeviceClearFieldValues``, or wrapped) gives None for that
        sample rather than a huge or negative rate.
        """
        now = self._clock()
        ids = [(field, ALL_LINKS) for _, field in NVLINK_FIELDS]
        values = self._read(self._api.nvmlDeviceGetFieldValues, handle, ids) or []
        by_id = {v.fieldId: v for v in values}
        prev = self._nvlink_prev.get(uuid, {})
        counters: dict[str, tuple[float, int]] = {}
        out: dict[str, float | None] = {}
        for key, field in NVLINK_FIELDS:
            value = by_id.get(field)
            out[key] = None
            if value is None or value.nvmlReturn != pynvml.NVML_SUCCESS:
                continue  # per-field NVML_ERROR_NOT_SUPPORTED etc.: n/a
            kib = int(value.value.ullVal)
            counters[key] = (now, kib)
            if key in prev:
                then, before = prev[key]
                if now > then and kib >= before:
                    out[key] = (kib - before) * 1024 / (now - then)
        self._nvlink_prev[uuid] = counters
        return out

    def _processes(self, handle: Any) -> list[dict[str, Any]]:
        """Compute and graphics processes on one device, merged by pid."""
        seen: dict[int, dict[str, Any]] = {}
        for fn in (
            self._api.nvmlDeviceGetComputeRunningProcesses,
            self._api.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            for proc in self._read(fn, handle) or []:
                used = getattr(proc, "usedGpuMemory", None)
                entry = seen.setdefault(
                    proc.pid,
                    {
                        "pid": proc.pid,
                        "name": self._process_name(proc.pid),
                        "mem_used": None,
                    },
                )
                if used is not None:
                    entry["mem_used"] = max(entry["mem_used"] or 0, used)
        return list(seen.values())

    def close(self) -> None:
        """Shut NVML down if this sampler started it."""
        if self.available:
            self._read(self._api.nvmlShutdown)
            self.available = False


def _psutil_process_name(pid: int) -> str | None:
    """Short process name, or None when the pid is gone or belongs to another container."""
    try:
        import psutil

        return psutil.Process(pid).name()
    except Exception:  # noqa: BLE001 - any failure just means "unknown name"
        return None
