"""torch's own formats where they bite: OOM message sizes, inactive_split, multi-device files."""

from __future__ import annotations

import pickle

from torchlens.analysis.memory import fragmentation, oom
from torchlens.frontends.memory.api import load_gpumem
from torchlens.model.snapshot import Snapshot, normalize_snapshot
from torchlens.render.memory.report import fragmentation_rows

MIB = 1024 * 1024
GIB = 1024 * MIB

# The text of c10/cuda/CUDACachingAllocator.cpp's OutOfMemoryError, sizes by its
# format_size: "N bytes" up to 1024, then two decimals of KiB, MiB or GiB.
OOM_ZERO_FREE = (
    "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 0 bytes is free. Including non-PyTorch memory, this process has "
    "79.14 GiB memory in use. Of the allocated memory 77.52 GiB is allocated by PyTorch, "
    "and 1.12 GiB is reserved by PyTorch but unallocated. If reserved but unallocated "
    "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-"
    "pytorch-cuda-alloc-conf)")
OOM_SMALL = (
    "CUDA out of memory. Tried to allocate 512 bytes. GPU 1 has a total capacity of "
    "14.75 GiB of which 1.00 KiB is free. Process 4242 has 14.74 GiB memory in use. Of the "
    "allocated memory 2.00 GiB is allocated by PyTorch, with 512.00 MiB allocated in private "
    "pools (e.g., CUDA Graphs), and 1024 bytes is reserved by PyTorch but unallocated.")
# torch 2.1 misspelled "capacity"
OOM_OLD = ("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacty of "
           "14.75 GiB of which 3.06 MiB is free. Of the allocated memory 14.00 GiB is "
           "allocated by PyTorch, and 100.00 MiB is reserved by PyTorch but unallocated.")


def test_oom_sizes_printed_as_bytes_are_read():
    f = oom.parse_oom_message(OOM_ZERO_FREE)
    assert f == {"requested": 20 * MIB, "capacity": int(79.15 * GIB), "device_free": 0,
                 "allocated": int(77.52 * GIB), "free_cached": int(1.12 * GIB),
                 "allowed": None}
    g = oom.parse_oom_message(OOM_SMALL)
    assert g["requested"] == 512 and g["device_free"] == 1024 and g["free_cached"] == 1024
    assert g["allocated"] == 2 * GIB and g["capacity"] == int(14.75 * GIB)


def test_a_zero_free_device_is_diagnosed_with_its_zero():
    d = oom.from_snapshot(Snapshot(), message=OOM_ZERO_FREE)
    assert d is not None and d.device_free == 0
    # 1.12 GiB cached but free, none of it in a block for 20 MiB, nothing on the device
    assert d.total_free == int(1.12 * GIB) and d.cause == "fragmentation"


def test_old_torchs_misspelled_capacity():
    f = oom.parse_oom_message(OOM_OLD)
    assert f["capacity"] == int(14.75 * GIB) and f["device_free"] == int(3.06 * MIB)


def _segment(device, address, blocks, *, expandable=False):
    return {"device": device, "address": address, "total_size": sum(s for s, _ in blocks),
            "stream": 0, "segment_type": "large", "is_expandable": expandable,
            "blocks": [{"address": address + sum(s for s, _ in blocks[:i]), "size": s,
                        "requested_size": s, "state": st} for i, (s, st) in enumerate(blocks)]}


def test_inactive_split_is_torchs_and_expandable_free_is_shown_apart():
    snap = {"segments": [
        _segment(0, 1 << 30, [(2 * MIB, "active_allocated"), (18 * MIB, "inactive")]),
        _segment(0, 2 << 30, [(4 * MIB, "active_allocated"), (16 * MIB, "inactive")],
                 expandable=True)]}
    s = fragmentation.summarize(normalize_snapshot(snap))
    # torch's free_block leaves expandable segments out of inactive_split
    assert s.inactive_split == 18 * MIB and s.free_expandable == 16 * MIB


def test_the_panel_shows_memory_stats_figure_when_they_differ(tmp_path):
    a = _loaded(tmp_path, {"segments": [
        _segment(0, 1 << 30, [(2 * MIB, "active_allocated"), (18 * MIB, "inactive")])],
        "device_traces": [[]]})
    a.frag.torch_inactive_split = 6 * MIB
    rows = dict(fragmentation_rows(a))
    (label,) = [k for k in rows if k.startswith("inactive_split")]
    assert "6.0 MiB" in rows[label] or "6.00 MiB" in rows[label]
    assert "memory_stats" in rows[label] and "18" in rows[label]


def _loaded(tmp_path, snap):
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap))
    return load_gpumem(str(path)).analysis()


def test_a_file_from_a_second_gpu_shows_that_gpu_and_says_so(tmp_path):
    trace = [{"action": "alloc", "addr": 5 << 30, "size": 4 * MIB, "time_us": 1},
             {"action": "alloc", "addr": (5 << 30) + 4 * MIB, "size": 2 * MIB, "time_us": 2}]
    a = _loaded(tmp_path, {
        "segments": [_segment(1, 5 << 30, [(4 * MIB, "active_allocated"),
                                           (2 * MIB, "active_allocated"),
                                           (14 * MIB, "inactive")])],
        "device_traces": [[], trace]})
    assert [x.size for x in a.timeline.allocations] == [4 * MIB, 2 * MIB]
    assert a.timeline.end_allocated == 6 * MIB and a.timeline.start_allocated == 0
    assert any("no data for cuda:0; showing cuda:1" in n for n in a.notes)


def test_an_oom_under_a_process_limit_is_diagnosed_against_the_limit() -> None:
    """The message torch 2.11 printed on an H200 under set_per_process_memory_fraction(0.02)
    (scripts/gpu-check): 136 GiB free on the device, yet the process was at its 2.80 GiB."""
    from torchlens.analysis.memory.oom import from_snapshot

    message = ("CUDA out of memory. Tried to allocate 574.00 MiB. GPU 0 has a total capacity of "
               "139.80 GiB of which 136.11 GiB is free. Process 545 has 954.00 MiB memory in use. "
               "Including non-PyTorch memory, this process has 2.75 GiB memory in use. 2.80 GiB "
               "allowed; Of the allocated memory 2.24 GiB is allocated by PyTorch, and 5.50 MiB "
               "is reserved by PyTorch but unallocated.")
    d = from_snapshot(Snapshot(), message=message)
    gib = 1024**3
    assert d.limit == d.capacity == int(2.80 * gib)
    assert d.device_free < 0.6 * gib  # what was left under the limit, not 136 GiB
    assert d.cause == "exhaustion" and d.shortfall > 0
    assert "left under this process's limit of 2.8 GiB" in d.finding.sentence
    assert "The process is" in d.finding.sentence
    assert any("set_per_process_memory_fraction" in a.evidence for a in d.advice)
