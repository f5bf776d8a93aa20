"""A recorded window whose program called ``torch.cuda.empty_cache()``.

None of the shared snapshots has ``segment_free`` entries, so the window is
made by the model itself (its trace has the torch format): 30 segments of
100 MiB are used and freed, the program empties the cache, then allocates a
little. Replayed as if ``empty_cache`` had not happened, the simulated
reserved-at-end came out ~2.9 GiB above the real 70 MiB.
"""

from __future__ import annotations

import pytest

from torchlens.analysis.memory.allocator import CachingAllocator
from torchlens.analysis.memory.allocator.replay import empty_cache_points, replay
from torchlens.analysis.memory.what_if import real_figures, run_model
from torchlens.model.snapshot import Snapshot, TraceEntry

MiB = 1 << 20


def _program() -> Snapshot:
    a = CachingAllocator()
    big = [a.malloc(100 * MiB) for _ in range(30)]
    for b in big:
        a.free(b)
    a.empty_cache()
    keep = [a.malloc(3 * MiB) for _ in range(5)]
    a.free(a.malloc(50 * MiB))
    assert keep
    return a.snapshot()


@pytest.mark.parametrize("start", [0, 30], ids=["whole-run", "window-after-the-allocs"])
def test_simulated_reserved_follows_the_programs_empty_cache(start):
    snap = _program()
    trace = snap.device_traces[0][start:]
    assert any(e.action == "segment_free" for e in trace)
    real = real_figures(snap, trace)["reserved"]
    sim = run_model(trace, start_snapshot=snap).figures()["reserved"]
    assert real == 70 * MiB
    assert abs(sim - real) <= 20 * MiB, (sim, real)


def test_empty_cache_points_leave_the_failing_retry_to_the_model():
    trace = [
        TraceEntry("segment_free", 0, 2 * MiB),
        TraceEntry("segment_free", 2 * MiB, 2 * MiB),
        TraceEntry("free_requested", 9, 512),
        TraceEntry("segment_free", 4 * MiB, 2 * MiB),
        TraceEntry("oom", 0, 512, device_free=0),
        TraceEntry("segment_unmap", 8 * MiB, 2 * MiB),
    ]
    assert empty_cache_points(trace) == {0, 5}
    assert replay(iter(trace), mode="simulate").empty_caches == 2
