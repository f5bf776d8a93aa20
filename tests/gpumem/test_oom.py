"""OOM diagnosis: a real shared snapshot with fragmentation, and a synthetic exhaustion."""

from __future__ import annotations

from gpumem_fixtures import SNAPSHOTS

from torchlens.analysis import fragmentation
from torchlens.analysis.allocator import AllocatorConfig
from torchlens.analysis.memory_model import run_model
from torchlens.analysis.oom import from_model_oom, from_snapshot, parse_oom_message
from torchlens.model.snapshot import load_snapshot

GIB = 1024**3
MIB = 1024**2


def test_parse_torch_message():
    msg = ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
           "79.15 GiB of which 6.69 MiB is free. Including non-PyTorch memory, this process has "
           "79.14 GiB memory in use. Of the allocated memory 77.34 GiB is allocated by PyTorch, "
           "and 1.31 GiB is reserved by PyTorch but unallocated.")
    f = parse_oom_message(msg)
    assert f["requested"] == 20 * MIB and f["free_cached"] == int(1.31 * GIB)
    assert f["device_free"] == int(6.69 * MIB) and f["allocated"] == int(77.34 * GIB)


def test_fragmented_shared_snapshot():
    snap = load_snapshot(SNAPSHOTS / "ftcourse_older_format.pickle")
    s = fragmentation.summarize(snap)
    request = s.largest_free["large"] + 2 * MIB  # fits the free total, not any block
    assert s.free_cached > request
    trace = [{"action": "oom", "addr": 0, "size": request, "device_free": 0, "frames": []}]
    d = from_snapshot(snap, trace=trace)
    assert d.cause == "fragmentation"
    assert d.free_cached == s.free_cached and d.largest_usable <= s.largest_free["large"]
    assert d.inactive_split == s.inactive_split > 0
    actions = " ".join(a.action for a in d.advice)
    assert "expandable_segments:True" in actions and "max_split_size_mb" in actions
    # every piece of advice carries a figure
    assert all(any(ch.isdigit() for ch in a.evidence) for a in d.advice)


def test_synthetic_exhaustion_with_the_model():
    trace, t = [], 0
    for i in range(12):  # 12 x 100 MiB kept alive on a 1 GiB card
        trace.append({"action": "alloc", "addr": 1000 + i, "size": 100 * MIB, "time_us": t,
                      "frames": [{"filename": "<ipython-input-3-ab>", "line": 4, "name": "<module>"}]})
        t += 1
    run = run_model(trace, AllocatorConfig(), capacity=GIB)
    assert run.ooms
    idx, first = run.ooms[0]
    d = from_model_oom(first, run.snapshot, site="cell [3] line 4")
    assert d.cause == "exhaustion" and d.requested == 100 * MIB
    assert d.capacity == GIB and d.allocated >= 10 * 100 * MIB
    assert "smaller batch" in d.advice[0].action
