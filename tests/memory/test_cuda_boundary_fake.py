"""The CUDA path on a CPU machine: fakes of exactly the boundary functions, real data."""

from __future__ import annotations

import pytest
from gpumem_fixtures import SNAPSHOTS

import torchlens
from torchlens.capture.memory import cuda as cuda_memory
from torchlens.capture.memory.capture import MemoryCapture
from torchlens.model.snapshot import load_snapshot


def _stats(alloc: int, reserved: int, retries: int = 0) -> dict[str, int]:
    """A memory_stats() dict with the real key names (pytorch-facts.md)."""
    out = {}
    for name in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                 "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"):
        for pool in ("all", "small_pool", "large_pool"):
            for field in ("current", "peak", "allocated", "freed"):
                out[f"{name}.{pool}.{field}"] = 0
    out["allocated_bytes.all.current"] = alloc
    out["reserved_bytes.all.current"] = reserved
    out["allocated_bytes.all.peak"] = alloc
    out["reserved_bytes.all.peak"] = reserved
    out.update(num_alloc_retries=retries, num_ooms=0, num_sync_all_streams=0,
               num_device_alloc=0, num_device_free=0, max_split_size=-1)
    return out


@pytest.fixture
def fake_cuda(monkeypatch):
    snap = load_snapshot(SNAPSHOTS / "eor_nn_with_snapshot_actions.pickle")
    t0 = min(e.time_us for e in snap.device_traces[0])
    calls = []
    stats = iter([_stats(8783856, 134217728), _stats(48760832, 134217728, retries=2)])
    monkeypatch.setattr(cuda_memory, "cuda_available", lambda: True)
    monkeypatch.setattr(cuda_memory, "allocator_backend", lambda: "native")
    monkeypatch.setattr(cuda_memory, "history_enabled", lambda: False)
    monkeypatch.setattr(cuda_memory, "start_history",
                        lambda max_entries, depth: calls.append(("start", depth)))
    monkeypatch.setattr(cuda_memory, "stop_history", lambda: calls.append(("stop",)))
    monkeypatch.setattr(cuda_memory, "take_snapshot", lambda: snap)
    monkeypatch.setattr(cuda_memory, "memory_stats", lambda device: next(stats))
    monkeypatch.setattr("time.time_ns", lambda: t0 * 1000)  # the cell starts at the trace
    return calls


def test_capture_uses_only_the_boundary(fake_cuda):
    with MemoryCapture() as cap:
        pass
    p = cap.profile
    assert fake_cuda == [("start", 32), ("stop",)]
    assert p.payload.measured_on == "cuda"
    assert not any("allocator model" in u for u in p.unmeasured)
    trace = p.snapshots["device0"].device_traces[0]
    assert len(trace) == 5803
    assert all(f.filename.endswith(".py") or f.filename.startswith("<")
               for e in trace for f in e.frames)


def test_cuda_result_uses_the_snapshot_and_stats(fake_cuda):
    with torchlens.gpumem(simulate=True, alloc_conf="expandable_segments:True") as r:
        pass
    a = r.analysis()
    assert a.reserved_source == "snapshot"
    assert a.timeline.start_allocated == 8783856
    assert a.frag.reserved == 134217728
    real = dict((row[0], row[1]) for row in a.comparison)
    assert real["alloc retries"] == 2 and real["allocated at end"] == 48760832
    assert a.simulated is not None and a.simulated.config.expandable_segments
    html = r._repr_mimebundle_()["text/html"]
    assert "Fragmentation" in html and "what if" in html


def test_history_is_stopped_when_the_snapshot_fails(fake_cuda, monkeypatch):
    def boom():
        raise RuntimeError("driver gone")

    monkeypatch.setattr(cuda_memory, "take_snapshot", boom)
    with pytest.raises(RuntimeError):
        with MemoryCapture():
            pass
    assert fake_cuda[-1] == ("stop",)
