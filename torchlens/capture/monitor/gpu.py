"""GPU sampler: one NVML reading per call, as a timestamped ``GpuSample``.

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

* NVML is started once per process and never shut down by a sampler
  (``monitor.nvml.start``: a start can take hundreds of ms).
* ``nvmlInit`` failing (no library, driver not loaded, ...) is not an error:
  the sampler reports ``available=False`` and a status line
  ``"no NVIDIA GPU found (reason)"`` that the UI shows verbatim; on a ROCm
  build of torch the line says "ROCm build, NVML not available" instead.
* every metric is read on its own; any ``NVMLError`` (NotSupported on consumer
  cards and MIG slices, NoPermission in containers, ...) gives ``None``, which
  the UI shows as "n/a", and the device's ``not_read`` says which error.
* PCIe throughput (``nvmlDeviceGetPcieThroughput``) blocks for NVML's 20 ms
  sampling window per call, two calls per GPU: 320 ms for 8 GPUs, more than
  the 0.1 s shortest interval. It is read every ``pcie_interval`` seconds
  (5 by default) and the last reading is repeated in between, with its age
  (``pcie_age_s``).
* NVLink throughput comes from NVML field values (cumulative counters, summed
  over all links: scope UINT_MAX), so it is a rate only from the second
  sample on. Fields 138/139 (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``,
  KiB) come first; drivers that answer them ``NOT_SUPPORTED`` (NVLink 5) may
  give 202/204 (``NVML_FI_DEV_NVLINK_COUNT_XMIT/RCV_BYTES``, bytes, aggregate
  scope); both are asked in the one call and the first that answers is
  used. A device where neither does says so in ``not_read``.
* CUDA ordinals are mapped to NVML devices by UUID, honouring this process's
  ``CUDA_VISIBLE_DEVICES`` (which may list indices, GPU-/MIG- UUIDs or their
  unique prefixes): the server's own, not a notebook kernel's, which may
  differ (match a kernel's devices by ``uuid``). NVML numbers whole GPUs by
  PCI bus id; CUDA does so only with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. Its
  default, ``FASTEST_FIRST``, puts faster GPUs first, which is the PCI order
  only when every GPU is the same model; with mixed models, or with MIG on
  (CUDA then sees slices, not the GPU), an index cannot be mapped and
  ``cuda`` is None with the reason in ``cuda_note``.
* NVML's process ids are the host's: in a container (a nested pid namespace,
  ``NSpid`` in ``/proc/self/status``) they are not this machine's view of
  pids, so they are not named through ``psutil`` and the sample's
  ``pids`` says ``"host"``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec
import pynvml

from torchlens.capture.monitor import nvml
from torchlens.model.samples import (
    GpuDevice,
    GpuProcess,
    GpuReading,
    GpuSample,
    HostSample,
)

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

#: NVLink counters read per sample: result key -> (NVML field id, bytes per
#: unit) in the order tried; the first field a device answers is used.
NVLINK_FIELDS = (
    ("nvlink_tx_bps", ((pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 1024),
                       (pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_BYTES, 1))),
    ("nvlink_rx_bps", ((pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 1024),
                       (pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_BYTES, 1))),
)
#: Seconds between PCIe throughput reads (each blocks NVML's 20 ms window).
PCIE_INTERVAL = 5.0
#: NVML return code -> its name, to say why a field was not read.
_RETURN_NAMES = {getattr(pynvml, n): n for n in dir(pynvml) if n.startswith("NVML_ERROR_")}
#: ``scopeId`` UINT_MAX: NVML sums the throughput counter over all of a GPU's links.
ALL_LINKS = 0xFFFFFFFF


SampleT = TypeVar("SampleT", bound=HostSample | GpuSample, covariant=True)


class Sampler(Protocol[SampleT]):
    """What the monitor needs from a sampler (``Sampler[HostSample]``: the host's,
    ``Sampler[GpuSample]``: the GPUs')."""

    def sample(self) -> SampleT:
        """Return one reading now, taken at its ``t`` (epoch seconds)."""
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


def cuda_order_note(
    devices: list[GpuDevice], environ: Mapping[str, str] | None = None
) -> str | None:
    """Why CUDA's device *indices* cannot be mapped to NVML's here (None: they can).

    ``devices`` as ``cuda_ordinals`` takes them."""
    env = os.environ if environ is None else environ
    whole = [d for d in devices if d.mig_parent is None]
    if any(d.mig for d in whole):
        return ("MIG is on: CUDA numbers MIG slices, not GPUs; name them in "
                "CUDA_VISIBLE_DEVICES by their MIG- UUIDs to map them")
    order = env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST").strip().upper()
    if order != "PCI_BUS_ID" and len({d.name for d in whole}) > 1:
        return ("CUDA_DEVICE_ORDER is FASTEST_FIRST (CUDA's default) and the GPUs differ, "
                "so CUDA's numbering is not NVML's: set CUDA_DEVICE_ORDER=PCI_BUS_ID or list "
                "GPU UUIDs in CUDA_VISIBLE_DEVICES")
    return None


def cuda_ordinals(
    devices: list[GpuDevice], environ: Mapping[str, str] | None = None
) -> dict[str, int]:
    """Map NVML device UUIDs to the CUDA ordinals a process with ``environ`` sees.

    ``devices``: their NVML ``index``, ``uuid``, ``mig_parent`` (None for a
    whole GPU), ``name`` and ``mig`` (MIG mode on). Without
    ``CUDA_VISIBLE_DEVICES`` CUDA sees the whole GPUs in NVML's order when
    ``cuda_order_note`` finds no reason it would not. With it, entry k of the
    list is ordinal k; CUDA stops at the first entry it cannot resolve, and
    so does this function (an index it cannot place counts as one).
    """
    env = os.environ if environ is None else environ
    whole = [d for d in devices if d.mig_parent is None]
    indices_known = cuda_order_note(devices, env) is None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return {d.uuid: k for k, d in enumerate(whole)} if indices_known else {}
    mapping: dict[str, int] = {}
    for ordinal, token in enumerate(t.strip() for t in visible.split(",")):
        if token.isdigit() and not indices_known:
            break
        match = _resolve_visible_token(token, devices, whole)
        if match is None or match.uuid in mapping:
            break
        mapping[match.uuid] = ordinal
    return mapping


def _resolve_visible_token(
    token: str, devices: list[GpuDevice], whole: list[GpuDevice]
) -> GpuDevice | None:
    """One ``CUDA_VISIBLE_DEVICES`` entry -> its device (index, or unique UUID prefix)."""
    if token.isdigit():
        index = int(token)
        return next((d for d in whole if d.index == index), None)
    if not token:
        return None
    hits = [d for d in devices if d.uuid.startswith(token)]
    return hits[0] if len(hits) == 1 else None


def _field_error(value: Any) -> str:
    """Why one field of ``nvmlDeviceGetFieldValues`` has no value, in NVML's words."""
    if value is None:
        return "not returned"
    return _RETURN_NAMES.get(value.nvmlReturn, f"NVML error {value.nvmlReturn}")


def _nested_pid_namespace() -> bool:
    """Whether this process runs in a pid namespace below the host's (a container):
    ``NSpid`` lists one pid per namespace level."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return len(line.split()) > 2
    except OSError:
        pass
    return False


class NvmlSampler:
    """Reads every visible NVIDIA GPU (and MIG slice) through NVML.

    ``api`` defaults to the ``pynvml`` module; pass a fake with the functions in
    ``NVML_FUNCTIONS`` to test. ``process_name`` turns a pid into a short name
    (psutil by default) so the UI can say which program holds the memory.
    ``hip``: torch's HIP version (found by ``nvml.rocm_build`` when not given);
    ``nested_pids``: whether NVML's host pids differ from this process's
    (``_nested_pid_namespace`` when not given).
    """

    def __init__(
        self,
        api: Any = None,
        environ: Mapping[str, str] | None = None,
        process_name: Callable[[int], str | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        pcie_interval: float = PCIE_INTERVAL,
        hip: str | None | bool = False,
        nested_pids: bool | None = None,
    ) -> None:
        self._api = pynvml if api is None else api
        self._nested = _nested_pid_namespace() if nested_pids is None else nested_pids
        self._memory_v2 = True  # until the bindings or the driver refuse version 2
        self._process_name = process_name or _psutil_process_name
        self._clock = clock  # monotonic: rates must not jump with the wall clock
        self.pcie_interval = pcie_interval
        # uuid -> {key: (field, clock, bytes)}: the previous NVLink counters
        self._nvlink_prev: dict[str, dict[str, tuple[int, float, int]]] = {}
        # uuid -> (clock, tx, rx, {key: error}) of the last PCIe read
        self._pcie: dict[str, tuple[float, Any, Any, dict[str, str]]] = {}
        self.available = False
        self.status = ""
        self.driver: str | None = None
        self.devices: list[GpuDevice] = []
        self._handles: dict[str, Any] = {}
        self._start(environ, nvml.rocm_build() if hip is False else hip)

    def _start(self, environ: Mapping[str, str] | None, hip: Any) -> None:
        """Start NVML (once per process) and enumerate devices; failures become ``status``."""
        try:
            nvml.start(self._api)
        except pynvml.NVMLError as err:
            self.status = (nvml.rocm_status(str(hip)) if hip
                           else f"no NVIDIA GPU found ({_init_failure_reason(err)})")
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
        env = os.environ if environ is None else environ
        ordinals = cuda_ordinals(self.devices, env)
        note = cuda_order_note(self.devices, env)
        for dev in self.devices:
            dev.cuda = ordinals.get(dev.uuid)
            dev.cuda_note = note if dev.cuda is None and note else None
        visible = env.get("CUDA_VISIBLE_DEVICES")
        self.status = (
            f"{len(self.devices)} NVIDIA device(s), driver {self.driver or 'n/a'}; "
            "CUDA ordinals as this process sees them ("
            + (f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None
               else "CUDA_VISIBLE_DEVICES unset") + ")"
            + (f"; {note}" if note and any(d.cuda is None for d in self.devices) else "")
        )

    def _enumerate(self, index: int) -> None:
        """Add GPU ``index`` and, when MIG mode is on, its MIG slices."""
        handle = self._read(self._api.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return
        whole = self._add(handle, index, None)
        mode = self._read(self._api.nvmlDeviceGetMigMode, handle)
        if not mode or mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            return
        whole.mig = True
        slots = self._read(self._api.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        for slot in range(slots):
            mig = self._read(
                self._api.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot
            )
            if mig is not None:
                self._add(mig, index, index, slot)

    def _add(self, handle: Any, index: int, parent: int | None, slot: int = 0) -> GpuDevice:
        uuid = self._read(self._api.nvmlDeviceGetUUID, handle)
        uuid = f"nvml-{index}-{slot}" if uuid is None else _text(uuid)
        name = self._read(self._api.nvmlDeviceGetName, handle)
        self._handles[uuid] = handle
        dev = GpuDevice(index=index, mig_parent=parent,
                        mig_slot=slot if parent is not None else None, mig=False, uuid=uuid,
                        name="n/a" if name is None else _text(name))
        self.devices.append(dev)
        return dev

    def _read(self, fn: Callable[..., Any], *args: Any,
              missing: dict[str, str] | None = None, key: str = "") -> Any:
        """Call one NVML function; an NVML error means "not available" (None),
        named in ``missing[key]`` when given."""
        try:
            return fn(*args)
        except pynvml.NVMLError as err:
            if missing is not None:
                missing[key] = type(err).__name__
            return None

    def _memory(self, handle: Any, missing: dict[str, str]) -> Any:
        """Memory info, version 2 where the bindings and the driver have it.

        Version 1's ``used`` is total minus free, so it counts the memory the
        driver reserves for itself (about 615 MiB on an H200 with driver 580:
        3,726 MiB "used" where nvidia-smi said 3,111, scripts/gpu-check);
        version 2 reports that reservation apart, and its ``used`` is what
        nvidia-smi shows."""
        v2 = getattr(pynvml, "nvmlMemory_v2", None)
        if v2 is not None and self._memory_v2:
            try:
                return self._api.nvmlDeviceGetMemoryInfo(handle, version=v2)
            except (TypeError, pynvml.NVMLError):
                self._memory_v2 = False  # old bindings or driver: v1 from now on
        mem = self._read(self._api.nvmlDeviceGetMemoryInfo, handle, missing=missing,
                         key="mem_used")
        if mem is not None:
            missing.setdefault("mem_reserved", "NVML memory info v2 not available: "
                               "mem_used includes the driver's reserved memory")
        return mem

    def sample(self) -> GpuSample:
        """One reading of every device: utilization, memory, temperature, power, PCIe, NVLink, processes."""
        now = time.time()
        gpus = [self._sample_device(dev) for dev in self.devices]
        return GpuSample(t=now, available=self.available, status=self.status,
                         driver=self.driver, pids="host" if self._nested else "local",
                         gpus=gpus)

    def _sample_device(self, dev: GpuDevice) -> GpuReading:
        api, handle = self._api, self._handles[dev.uuid]
        missing: dict[str, str] = {}
        util = self._read(api.nvmlDeviceGetUtilizationRates, handle, missing=missing,
                          key="util_gpu")
        mem = self._memory(handle, missing)
        power = self._read(api.nvmlDeviceGetPowerUsage, handle, missing=missing, key="power_w")
        limit = self._read(api.nvmlDeviceGetEnforcedPowerLimit, handle, missing=missing,
                           key="power_limit_w")
        temp = self._read(api.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU,
                          missing=missing, key="temp_c")
        pcie = self._pcie_reading(dev.uuid, handle)
        missing.update(pcie[3])
        nvlink_tx, nvlink_rx = self._nvlink(dev.uuid, handle, missing)
        return GpuReading(
            **msgspec.structs.asdict(dev),
            util_gpu=None if util is None else util.gpu,
            util_mem=None if util is None else util.memory,
            mem_used=None if mem is None else mem.used,
            mem_total=None if mem is None else mem.total,
            # the driver's own reservation (v2 only): not in mem_used, as nvidia-smi shows it
            mem_reserved=getattr(mem, "reserved", None),
            temp_c=temp,
            power_w=None if power is None else power / 1000.0,
            power_limit_w=None if limit is None else limit / 1000.0,
            pcie_tx_bps=None if pcie[1] is None else pcie[1] * 1024,  # NVML gives KB/s
            pcie_rx_bps=None if pcie[2] is None else pcie[2] * 1024,
            pcie_age_s=self._clock() - pcie[0],
            nvlink_tx_bps=nvlink_tx, nvlink_rx_bps=nvlink_rx,
            processes=self._processes(handle),
            not_read=missing,
        )

    def _pcie_reading(self, uuid: str, handle: Any) -> tuple[float, Any, Any, dict[str, str]]:
        """The last PCIe reading, taken again once ``pcie_interval`` has passed."""
        now = self._clock()
        last = self._pcie.get(uuid)
        if last is None or now - last[0] >= self.pcie_interval:
            missing: dict[str, str] = {}
            read = self._api.nvmlDeviceGetPcieThroughput
            tx = self._read(read, handle, pynvml.NVML_PCIE_UTIL_TX_BYTES, missing=missing,
                            key="pcie_tx_bps")
            rx = self._read(read, handle, pynvml.NVML_PCIE_UTIL_RX_BYTES, missing=missing,
                            key="pcie_rx_bps")
            last = self._pcie[uuid] = (now, tx, rx, missing)
        return last

    def _nvlink(self, uuid: str, handle: Any,
                missing: dict[str, str]) -> tuple[float | None, float | None]:
        """NVLink tx/rx in bytes/s from the change of NVML's cumulative counters.

        Why counters and not a rate: NVML only exposes NVLink traffic as
        totals, so a rate needs the previous sample (the first one is None).
        A counter that went down (reset by a driver reload or
        ``nvmlDeviceClearFieldValues``, or wrapped), or a change of field
        between samples, gives None for that sample rather than a wrong rate.
        """
        now = self._clock()
        ids = [(field, ALL_LINKS) for _, tries in NVLINK_FIELDS for field, _ in tries]
        values = self._read(self._api.nvmlDeviceGetFieldValues, handle, ids,
                            missing=missing, key="nvlink")
        if values is None:  # the whole call failed: both keys say why
            reason = missing.pop("nvlink")
            missing.update({key: reason for key, _ in NVLINK_FIELDS})
        by_id = {v.fieldId: v for v in values or []}
        prev = self._nvlink_prev.get(uuid, {})
        counters: dict[str, tuple[int, float, int]] = {}
        out: dict[str, float | None] = {}
        for key, tries in NVLINK_FIELDS:
            out[key] = None
            answered = [(f, unit, by_id[f]) for f, unit in tries if f in by_id
                        and by_id[f].nvmlReturn == pynvml.NVML_SUCCESS]
            if not answered:
                if values is not None:
                    missing[key] = "; ".join(f"field {f}: {_field_error(by_id.get(f))}"
                                             for f, _ in tries)
                continue
            field, unit, value = answered[0]
            total = int(value.value.ullVal) * unit
            counters[key] = (field, now, total)
            if key in prev and prev[key][0] == field:
                _, then, before = prev[key]
                if now > then and total >= before:
                    out[key] = (total - before) / (now - then)
        self._nvlink_prev[uuid] = counters
        return out["nvlink_tx_bps"], out["nvlink_rx_bps"]

    def _processes(self, handle: Any) -> list[GpuProcess]:
        """Compute and graphics processes on one device, merged by pid.

        NVML's pids are the host's: in a container they are not this process's
        view, so they are not named here (another process may hold that number)."""
        seen: dict[int, GpuProcess] = {}
        for fn in (
            self._api.nvmlDeviceGetComputeRunningProcesses,
            self._api.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            for proc in self._read(fn, handle) or []:
                used = getattr(proc, "usedGpuMemory", None)
                entry = seen.get(proc.pid)
                if entry is None:
                    entry = seen[proc.pid] = GpuProcess(
                        pid=proc.pid,
                        name=None if self._nested else self._process_name(proc.pid))
                if used is not None:
                    entry.mem_used = max(entry.mem_used or 0, used)
        return list(seen.values())

    def close(self) -> None:
        """Stop sampling. NVML stays started for the process (``monitor.nvml``):
        the next sampler or capture does not pay its start again."""
        self.available = False


def _psutil_process_name(pid: int) -> str | None:
    """Short process name, or None when the pid is gone or belongs to another container."""
    try:
        import psutil

        return psutil.Process(pid).name()
    except Exception:  # noqa: BLE001 - any failure just means "unknown name"
        return None
