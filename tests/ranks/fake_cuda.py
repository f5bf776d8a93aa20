"""A fake of the torch.cuda boundary a rank reads, as torch documents it.

What it keeps from the real thing (torch/cuda/__init__.py, torch/cuda/memory.py):

- CUDA starts lazily: ``is_initialized()`` is False until a call that runs
  ``_lazy_init`` (``current_device``, ``set_device``, ``synchronize``,
  ``get_device_properties``); each such first call is logged in ``inits``,
  the context a real GPU would get on the calling thread's device.
- The current device is per thread (``cudaGetDevice``): every thread starts
  on device 0, whatever another thread set.
- ``memory_stats_as_nested_dict(device=None)`` returns ``{}`` before CUDA is
  initialised, and for ``None`` reads the calling thread's current device, as
  do ``memory_stats``, ``memory_allocated`` and ``memory_reserved``.
- ``memory_snapshot()`` / ``memory._snapshot()`` return every device's
  segments, each carrying its ``device``; the ``cudaMallocAsync`` backend
  refuses to snapshot (its ``snapshot`` raises in CUDAMallocAsyncAllocator.cpp).
- Per-rank ``CUDA_VISIBLE_DEVICES``: a process sees only its GPUs, numbered
  from 0; the GPU's ``uuid`` says which physical one it is.
- ``Event`` (torch/cuda/streams.py over c10/cuda/CUDAEvent.h): making one
  starts nothing, the CUDA event is created at its first ``record(stream)``
  on the stream's device (a later record on another device fails);
  ``query()`` is True for an event never recorded, else whether the GPU has
  passed it; ``elapsed_time(end)`` raises RuntimeError unless both were
  recorded ("Both events must be recorded...") and completed ("Both events
  must be completed..."), and returns milliseconds; ``synchronize()`` waits
  (logged in ``calls``). The GPU is a clock per device: ``work(ms)`` queues
  work on it, an event records the time its queued work ends, and
  ``complete()`` lets the GPU finish what is queued (``done`` ms).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch

MiB = 1 << 20


@dataclass
class Gpu:
    uuid: str
    allocated: int = 0
    reserved: int = 0
    inactive_split: int = 0
    #: sizes of the inactive blocks of its one segment
    free_blocks: list[int] = field(default_factory=list)


class FakeStream:
    """What ``current_stream(device)`` returns."""

    def __init__(self, fake: FakeCuda, device_index: int) -> None:
        self.fake, self.device_index = fake, device_index

    def synchronize(self) -> None:
        self.fake.calls.append(("stream.synchronize", self.device_index))


def _event_class(fake: FakeCuda) -> type:
    class Event:
        def __init__(self, enable_timing: bool = False, blocking: bool = False,
                     interprocess: bool = False, external: bool = False) -> None:
            self.enable_timing = enable_timing
            self.device: int | None = None
            self.at: float | None = None  # GPU ms at which its captured work ends
            fake.events.append(self)

        def record(self, stream: FakeStream | None = None) -> None:
            stream = stream or fake.current_stream()
            if self.device is None:
                self.device = stream.device_index
            elif self.device != stream.device_index:
                raise RuntimeError("Event device does not match recording stream's device")
            self.at = fake.tail[stream.device_index]
            fake.calls.append(("event.record", stream.device_index))

        def query(self) -> bool:
            return self.at is None or self.at <= fake.done[self.device]

        def elapsed_time(self, end: Event) -> float:
            fake.calls.append(("event.elapsed_time", self.device))
            if self.at is None or end.at is None:
                raise RuntimeError("Both events must be recorded before calculating elapsed time.")
            if not (self.query() and end.query()):
                raise RuntimeError("Both events must be completed before calculating elapsed time.")
            if not (self.enable_timing and end.enable_timing):
                raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
            return end.at - self.at

        def synchronize(self) -> None:
            fake.calls.append(("event.synchronize", self.device))

    return Event


class FakeCuda:
    def __init__(self, gpus: list[Gpu], backend: str = "native") -> None:
        self.gpus = gpus
        self.backend = backend
        self.initialized = False
        self.inits: list[str] = []  # the calls that created a CUDA context
        self.calls: list[tuple[str, Any]] = []
        self.snapshot_error: Exception | None = None
        self._local = threading.local()
        self.events: list[Any] = []  # every Event made
        self.tail = [0.0] * len(gpus)  # GPU ms when each device's queued work ends
        self.done = [0.0] * len(gpus)  # GPU ms each device has reached
        self.capturing = False
        self.Event = _event_class(self)

    # -- the GPU's clock and CUDA events -------------------------------------------
    def work(self, ms: float, device: int | None = None) -> None:
        """Queue ``ms`` of kernels on ``device`` (the calling thread's by default)."""
        i = self._current() if device is None else device
        self.tail[i] += ms

    def complete(self) -> None:
        """The GPUs finish everything queued so far."""
        self.done = list(self.tail)

    def current_stream(self, device: Any = None) -> FakeStream:
        self._lazy_init("current_stream")
        return FakeStream(self, self._index(device))

    def is_current_stream_capturing(self) -> bool:
        return self.capturing

    # -- lazy initialisation and the per-thread device -----------------------
    def _lazy_init(self, why: str) -> None:
        if not self.initialized:
            self.initialized = True
            self.inits.append(why)

    def _current(self) -> int:
        return getattr(self._local, "device", 0)

    def _index(self, device: Any) -> int:
        if device is None:
            return self._current()
        if isinstance(device, torch.device):
            return device.index if device.index is not None else self._current()
        return int(device)

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return len(self.gpus)

    def current_device(self) -> int:
        self._lazy_init("current_device")
        return self._current()

    def set_device(self, device: Any) -> None:
        self._lazy_init("set_device")
        self._local.device = self._index(device)

    def synchronize(self, device: Any = None) -> None:
        self._lazy_init("synchronize")
        self.calls.append(("synchronize", self._index(device)))

    def get_device_properties(self, device: Any = None) -> Any:
        self._lazy_init("get_device_properties")
        i = self._index(device)
        if not 0 <= i < len(self.gpus):
            raise AssertionError("Invalid device id")
        return SimpleNamespace(name="Fake GPU", uuid=self.gpus[i].uuid, total_memory=80 << 30)

    def get_allocator_backend(self) -> str:
        return self.backend

    # -- the allocator's counters ------------------------------------------------
    def memory_stats_as_nested_dict(self, device: Any = None) -> dict[str, Any]:
        self.calls.append(("memory_stats_as_nested_dict", device))
        if not self.initialized:
            return {}
        g = self.gpus[self._index(device)]

        def stat(v: int) -> dict[str, dict[str, int]]:
            return {"all": {"current": v, "peak": v, "allocated": v, "freed": 0}}

        return {"allocated_bytes": stat(g.allocated), "reserved_bytes": stat(g.reserved),
                "inactive_split_bytes": stat(g.inactive_split), "num_ooms": 0}

    def memory_stats(self, device: Any = None) -> dict[str, Any]:
        self.calls.append(("memory_stats", device))
        nested = self.memory_stats_as_nested_dict(device)
        return {f"{k}.all.current": v["all"]["current"]
                for k, v in nested.items() if isinstance(v, dict)}

    def memory_allocated(self, device: Any = None) -> int:
        return self.memory_stats(device).get("allocated_bytes.all.current", 0)

    def memory_reserved(self, device: Any = None) -> int:
        return self.memory_stats(device).get("reserved_bytes.all.current", 0)

    # -- snapshots ---------------------------------------------------------------
    def _segments(self) -> list[dict[str, Any]]:
        if self.backend == "cudaMallocAsync":
            raise RuntimeError("Calling snapshot with backend:cudaMallocAsync is not meaningful.")
        if self.snapshot_error is not None:
            raise self.snapshot_error
        return [{"device": i, "total_size": g.reserved,
                 "blocks": [{"size": s, "state": "inactive"} for s in g.free_blocks]
                 + [{"size": g.allocated, "state": "active_allocated"}]}
                for i, g in enumerate(self.gpus)]

    def memory_snapshot(self, mempool_id: Any = None, include_traces: bool = True) -> Any:
        self.calls.append(("memory_snapshot", include_traces))
        return self._segments()

    def full_snapshot(self) -> dict[str, Any]:
        self.calls.append(("_snapshot", None))
        return {"segments": self._segments(), "device_traces": [[] for _ in self.gpus]}

    def install(self, mp: pytest.MonkeyPatch) -> FakeCuda:
        for name in ("is_available", "is_initialized", "device_count", "current_device",
                     "set_device", "synchronize", "get_device_properties",
                     "get_allocator_backend", "memory_stats_as_nested_dict", "memory_stats",
                     "memory_allocated", "memory_reserved", "memory_snapshot", "Event",
                     "current_stream", "is_current_stream_capturing"):
            mp.setattr(torch.cuda, name, getattr(self, name))
        mp.setattr(torch.cuda.memory, "_snapshot", lambda *a, **k: self.full_snapshot())
        return self


def one_visible_gpu(uuid: str, allocated: int = 0) -> list[Gpu]:
    """What a rank under per-rank CUDA_VISIBLE_DEVICES sees: one GPU, cuda:0."""
    return [Gpu(uuid=uuid, allocated=allocated, reserved=2 * allocated)]
