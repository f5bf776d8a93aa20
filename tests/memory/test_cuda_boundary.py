"""%%gpumem against a fake of torch.cuda.memory that behaves as torch 2.13's sources say.

What the fake reproduces, with where torch says it:
- ``_record_memory_history_impl`` takes ``device`` and never passes it on
  (torch/cuda/memory.py): history is on for every device or none;
- ``_snapshot()`` returns every device's segments (each with ``device``) and one
  trace per device in ``device_traces``, whatever device was asked for;
- the history is a ring buffer of ``max_entries`` per device (the C++ quoted in
  ``_record_memory_history``'s docstring);
- ``backend:cudaMallocAsync``: ``recordHistory`` and ``isHistoryEnabled`` raise
  "cudaMallocAsync does not yet support recordHistory ..." and ``snapshot``
  raises too (CUDAMallocAsyncAllocator.cpp); memory_stats still works;
- ``free()`` lowers ``allocated_bytes`` by the block's size and records
  ``free_requested``; ``free_completed`` follows once the block's stream uses
  are done (c10/cuda/CUDACachingAllocator.cpp).
"""

from __future__ import annotations

import copy
import sys
import time
from typing import Any

import pytest
import torch

import torchlens
from torchlens.analysis.memory.allocator import (
    AllocatorConfig,
    CachingAllocator,
    round_size,
)
from torchlens.analysis.memory.timeline import build_timeline
from torchlens.capture.memory import cuda as cuda_memory
from torchlens.capture.memory.capture import MemoryCapture
from torchlens.model import MemoryOptions
from torchlens.model.snapshot import TraceEntry

MIB = 1024 * 1024
ASYNC_MSG = ("cudaMallocAsync does not yet support recordHistory. "
             "If you need it, please file an issue describing your use case.")


class FakeAllocator:
    """Two devices' caching allocators behind torch.cuda.memory's functions."""

    def __init__(self, backend: str = "native", devices: int = 2) -> None:
        self.backend = backend
        self.recording = False
        self.max_entries = sys.maxsize
        self.traces: list[list[dict[str, Any]]] = [[] for _ in range(devices)]
        self.allocated = [0] * devices
        self.peak = [0] * devices
        self.reserved = [20 * MIB * (d + 1) for d in range(devices)]
        self.segments = [
            {"device": d, "address": (d + 1) << 40, "total_size": self.reserved[d],
             "stream": 0, "segment_type": "large", "allocated_size": 0, "active_size": 0,
             "requested_size": 0, "blocks": [{"address": (d + 1) << 40, "size": self.reserved[d],
                                               "requested_size": 0, "state": "inactive"}]}
            for d in range(devices)]
        self.calls: list[tuple[Any, ...]] = []

    # torch.cuda.memory's functions
    def _refuse_async(self) -> None:
        if self.backend == "cudaMallocAsync":
            raise RuntimeError(ASYNC_MSG)

    def record_memory_history(self, enabled: Any = "all", context: Any = "all",
                              stacks: str = "all", max_entries: int = sys.maxsize,
                              device: Any = None, **_: Any) -> None:
        self._refuse_async()
        self.calls.append(("record", enabled, context, max_entries))
        self.recording = enabled is not None  # on every device: `device` is ignored
        if self.recording:
            self.max_entries = max_entries

    def is_history_enabled(self) -> bool:
        self._refuse_async()
        return self.recording

    def snapshot(self, device: Any = None, augment_with_fx_traces: bool = False) -> dict:
        if self.backend == "cudaMallocAsync":
            raise RuntimeError("Calling snapshot with backend:cudaMallocAsync is not meaningful.")
        self.calls.append(("snapshot",))
        return {"segments": copy.deepcopy(self.segments),
                "device_traces": [list(t) for t in self.traces],
                "allocator_settings": {}, "external_annotations": []}

    def memory_snapshot(self, mempool_id: Any = None, include_traces: bool = True) -> list:
        self.calls.append(("memory_snapshot", include_traces))
        return copy.deepcopy(self.segments)

    def memory_stats(self, device: int) -> dict[str, int]:
        return {"allocated_bytes.all.current": self.allocated[device],
                "allocated_bytes.all.peak": self.peak[device],
                "reserved_bytes.all.current": self.reserved[device],
                "inactive_split_bytes.all.current": 0}

    # what the program does on the GPU
    def _push(self, device: int, action: str, addr: int, size: int, t_us: int | None) -> None:
        if not self.recording:
            return
        trace = self.traces[device]
        if len(trace) >= self.max_entries:
            trace.pop(0)  # the ring buffer overwrites its oldest entry
        trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                      "time_us": t_us or time.time_ns() // 1000,
                      "frames": [{"filename": "cell.py", "line": 3, "name": "<module>"}]})

    def alloc(self, device: int, addr: int, size: int, t_us: int | None = None) -> None:
        self.allocated[device] += size
        self.peak[device] = max(self.peak[device], self.allocated[device])
        self._push(device, "alloc", addr, size, t_us)

    def free(self, device: int, addr: int, size: int, *, stream_uses: bool = False,
             t_us: int | None = None) -> None:
        self.allocated[device] -= size
        self._push(device, "free_requested", addr, size, t_us)
        if not stream_uses:
            self._push(device, "free_completed", addr, size, t_us)

    def complete(self, device: int, addr: int, size: int) -> None:
        self._push(device, "free_completed", addr, size, None)


@pytest.fixture
def fake(monkeypatch):
    """Install a FakeAllocator; ``fake.backend = "cudaMallocAsync"`` switches backends."""
    f = FakeAllocator()
    monkeypatch.setattr(cuda_memory, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", f.record_memory_history)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", f.snapshot)
    monkeypatch.setattr(torch.cuda.memory, "get_allocator_backend", lambda: f.backend)
    monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", f.is_history_enabled, raising=False)
    monkeypatch.setattr(torch.cuda, "memory_stats", f.memory_stats)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", f.memory_snapshot)
    return f


def test_cudamallocasync_falls_back_to_memory_stats_and_says_so(fake):
    fake.backend = "cudaMallocAsync"
    fake.alloc(0, 1 << 30, 4 * MIB)
    with torchlens.gpumem() as r:  # must not raise on enter
        fake.alloc(0, 2 << 30, 6 * MIB)
    p = r.profile
    assert not p.payload.history and p.payload.allocator_backend == "cudaMallocAsync"
    assert any("cudaMallocAsync" in u and "memory_stats" in u for u in p.unmeasured)
    a = r.analysis()
    assert a.timeline.start_allocated == 4 * MIB and a.timeline.end_allocated == 10 * MIB
    assert a.timeline.peak_allocated == 10 * MIB  # memory_stats' peak rose in the cell
    assert not a.segments_measured
    html = r._repr_mimebundle_()["text/html"]
    assert "cudaMallocAsync" in html and "keeps no segments" in html
    assert "not measured:" in r._repr_mimebundle_()["text/plain"]
    assert ("snapshot",) not in fake.calls


def test_a_backend_that_refuses_history_is_reported_with_torchs_words(fake, monkeypatch):
    def refuse(*a: Any, **k: Any) -> None:
        raise RuntimeError("CUDAPluggableAllocator does not yet support recordHistory.")

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", refuse)
    with MemoryCapture() as cap:
        pass
    assert not cap.profile.payload.history
    assert any("CUDAPluggableAllocator does not yet support" in u for u in cap.profile.unmeasured)


def test_device_1_reads_only_device_1(fake):
    with torchlens.gpumem(device=1) as r:
        fake.alloc(0, 1 << 30, 64 * MIB)  # another GPU's work, recorded too
        fake.alloc(1, 3 << 30, 2 * MIB)
    a = r.analysis()
    assert a.timeline.end_allocated == 2 * MIB
    assert [x.size for x in a.timeline.allocations] == [2 * MIB]
    assert a.frag.reserved == fake.reserved[1]  # device 1's segments only
    assert any("also holds cuda:0" in n for n in a.notes)


def test_a_device_without_history_never_shows_another_gpus(fake):
    fake.segments = [s for s in fake.segments if s["device"] == 0]  # cuda:1 never used
    with torchlens.gpumem(device=1) as r:
        fake.alloc(0, 1 << 30, 64 * MIB)
    a = r.analysis()
    assert a.timeline.allocations == [] and a.frag.reserved == 0
    assert any("recorded nothing on cuda:1" in n for n in a.notes)


def test_a_users_recording_is_kept_on(fake):
    torch.cuda.memory._record_memory_history(max_entries=50)  # the user's, before the cell
    fake.alloc(0, 1 << 30, MIB, t_us=time.time_ns() // 1000 - 10_000)
    with torchlens.gpumem() as r:
        fake.alloc(0, 2 << 30, 2 * MIB)
    assert fake.recording and fake.max_entries == 50
    assert [c for c in fake.calls if c[0] == "record"] == [("record", "all", "all", 50)]
    p = r.profile
    assert p.payload.user_recording and p.payload.history_full is None
    a = r.analysis()
    assert [x.size for x in a.timeline.allocations] == [2 * MIB]  # the cell's entries only
    assert any("left it on" in n for n in a.notes)


def test_our_recording_is_stopped_and_records_stacks_of_allocations_only(fake):
    with MemoryCapture():
        fake.alloc(0, 1 << 30, MIB)
    records = [c for c in fake.calls if c[0] == "record"]
    assert records == [("record", "all", "alloc", 100_000), ("record", None, "all", sys.maxsize)]
    assert not fake.recording


def test_a_wrapped_history_says_what_is_missing(fake):
    from torchlens.analysis.memory.analyze import analyze

    fake.alloc(0, 1 << 30, 8 * MIB)  # alive before the cell
    with MemoryCapture(MemoryOptions(max_entries=4)) as cap:
        fake.free(0, 1 << 30, 8 * MIB)  # these two entries are overwritten
        for i in range(3):
            fake.alloc(0, (2 << 30) + i * 8 * MIB, 2 * MIB)
        fake.free(0, 2 << 30, 2 * MIB)
    p = cap.profile
    assert p.payload.history_full and p.payload.history_entries == 4
    a = analyze(p)
    tl = a.timeline
    # the kept entries start after the 8 MiB free: from stats_before the timeline
    # would end 8 MiB too high; worked back from stats_after it ends where torch does
    assert tl.end_allocated == fake.allocated[0] == 4 * MIB
    assert tl.start_allocated == 2 * MIB  # block 0 of the loop, allocated in the lost part
    assert any("ring buffer of 4 entries" in n and "was full" in n
               and "changed allocated memory by -6" in n for n in a.notes)


def test_take_segments_leaves_the_history_out(fake):
    segs = cuda_memory.take_segments()
    assert {s["device"] for s in segs} == {0, 1}
    assert ("memory_snapshot", False) in fake.calls


def test_timeline_allocated_falls_at_free_requested_like_the_allocator():
    """A record_stream-style free: free_completed long after free_requested."""
    cfg = AllocatorConfig()
    m = CachingAllocator(cfg)
    a = m.malloc(4 * MIB + 100)
    b = m.malloc(6 * MIB)
    m.free(a, stream_uses=True)  # the side stream still uses it
    c = m.malloc(8 * MIB)
    d = m.malloc(1000)  # a 1024-byte block in the small pool
    m.free_completed(a)
    m.free(b)
    m.free(d)
    trace = [TraceEntry(act, addr, size, s, time_us=10 * i)
             for i, (act, addr, size, s) in enumerate(m.trace)
             if act in ("alloc", "free_requested", "free_completed")]
    assert [e.action for e in trace].count("free_requested") == 3
    tl = build_timeline(trace, block_size=lambda n: round_size(n, cfg))
    assert tl.peak_allocated == m.stats.peak("allocated_bytes")
    assert tl.end_allocated == m.stats.current("allocated_bytes") == c.size
    # counting the block until free_completed would have peaked at a + b + c
    assert tl.peak_allocated < a.size + b.size + c.size
