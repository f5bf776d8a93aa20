"""Allocator rules that no shared snapshot exercises, case by case from the C++.

Each test's docstring names the function of c10/cuda/CUDACachingAllocator.cpp
(or c10/core/AllocatorConfig.cpp) whose rule it checks; the expected figures
were worked out by hand from that rule, not from running the model.
"""

from __future__ import annotations

import pytest

from torchlens.analysis.memory.allocator import (
    OOM,
    AllocatorConfig,
    CachingAllocator,
    allocation_size,
    load_segments,
    round_size,
)
from torchlens.analysis.memory.allocator.config import roundup_power2_next_division
from torchlens.model.errors import InputError

MB = 1024 * 1024
KB = 1024


def layout(alloc: CachingAllocator) -> list[tuple[int, list[tuple[int, str]]]]:
    """(segment size, [(block size, state)...]) per segment, by address."""
    snap = alloc.snapshot()
    return [
        (s.total_size, [(b.size, b.state) for b in s.blocks])
        for s in snap.segments
    ]


def actions(alloc: CachingAllocator) -> list[str]:
    return [e[0] for e in alloc.trace]


def test_round_size_min_block() -> None:
    """round_size: below kMinBlockSize (512) -> 512, else up to a multiple of 512."""
    cfg = AllocatorConfig()
    assert [round_size(n, cfg) for n in (1, 511, 512, 513, 1536, 1537)] == [
        512,
        512,
        512,
        1024,
        1536,
        2048,
    ]


def test_roundup_power2_divisions() -> None:
    """roundup_power2_next_division and round_size: with d divisions for the size's
    interval and size > 512*d, round up to the next of d steps between powers of 2."""
    assert roundup_power2_next_division(1200, 4) == 1280  # the C++ comment's example
    cfg = AllocatorConfig.parse("roundup_power2_divisions:4")
    assert round_size(1200, cfg) == 1536  # 1200 <= 512*4: plain 512 rounding
    assert (
        round_size(3 * MB + 1, cfg) == 3 * MB + 512 * KB
    )  # steps of 512 KiB in [2,4) MiB
    assert round_size(5 * MB + 1, cfg) == 6 * MB  # steps of 1 MiB in [4,8) MiB
    assert round_size(4 * MB, cfg) == 4 * MB  # powers of two stay
    alloc = CachingAllocator(cfg)
    b = alloc.malloc(3 * MB + 1)
    assert b.size == 3 * MB + 512 * KB


def test_roundup_power2_divisions_list_form() -> None:
    """AllocatorConfig::parseRoundUpPower2Divisions: the first interval's value also
    fills the intervals below it; '>' fills from the last named interval (inclusive)."""
    cfg = AllocatorConfig.parse("roundup_power2_divisions:[64:8,256:4,>:2]")
    d = cfg.roundup_power2_divisions
    assert d[:7] == [8] * 7  # 1..64 MiB
    assert d[7] == 0  # 128 MiB interval never named
    assert d[8:] == [2] * 8  # '>' overwrote 256 and everything above
    assert cfg.divisions_for(100 * MB) == 8  # log2(100 MiB) - 20 = 6
    assert cfg.divisions_for(300 * MB) == 2
    snap_settings = {
        "roundup_power2_divisions": {str(1 << i): v for i, v in enumerate(d)}
    }
    assert AllocatorConfig.from_settings(snap_settings).roundup_power2_divisions == d


def test_pools_and_segment_sizes() -> None:
    """get_pool / get_allocation_size: <= 1 MiB small pool in 2 MiB segments;
    1-10 MiB requests get 20 MiB segments; >= 10 MiB round up to 2 MiB."""
    assert allocation_size(1 * MB) == 2 * MB
    assert allocation_size(1 * MB + 512) == 20 * MB
    assert allocation_size(10 * MB - 512) == 20 * MB
    assert allocation_size(10 * MB) == 10 * MB
    assert allocation_size(10 * MB + 512) == 12 * MB
    for request, pool, segment in (
        (1 * MB, "small", 2 * MB),
        (1 * MB + 1, "large", 20 * MB),
        (10 * MB + 1, "large", 12 * MB),
    ):
        alloc = CachingAllocator()  # one each: later requests would reuse a remainder
        alloc.malloc(request)
        (seg,) = alloc.snapshot().segments
        assert (seg.segment_type, seg.total_size) == (pool, segment)


def test_small_pool_split() -> None:
    """should_split: the small pool splits off any remainder >= kMinBlockSize."""
    alloc = CachingAllocator()
    alloc.malloc(1000)
    assert layout(alloc) == [
        (2 * MB, [(1024, "active_allocated"), (2 * MB - 1024, "inactive")])
    ]
    alloc.malloc(1 * MB)
    alloc.malloc(1 * MB - 1536)  # leaves exactly 512 bytes
    assert layout(alloc)[0][1][-1] == (512, "inactive")
    assert alloc.memory_stats()["inactive_split_bytes.small_pool.current"] == 512


def test_large_pool_split_rule() -> None:
    """should_split: the large pool splits only when the remainder is > kSmallSize
    (1 MiB) and the size is below max_split_size; otherwise the block keeps it."""
    alloc = CachingAllocator()
    b = alloc.malloc(19 * MB + 512 * KB)  # 20 MiB segment, 0.5 MiB remainder: kept
    assert b.size == 20 * MB
    c = alloc.malloc(11 * MB)  # 12 MiB segment, exactly 1 MiB remainder: kept
    assert c.size == 12 * MB
    d = alloc.malloc(9 * MB)  # 20 MiB segment, 11 MiB remainder: split
    assert d.size == 9 * MB
    s = alloc.memory_stats()
    assert s["allocated_bytes.all.current"] == 20 * MB + 12 * MB + 9 * MB
    assert s["requested_bytes.all.current"] == 19 * MB + 512 * KB + 11 * MB + 9 * MB
    assert s["inactive_split_bytes.large_pool.current"] == 11 * MB


def test_best_fit_by_size_then_address_and_stream() -> None:
    """get_free_block: lower_bound in the set ordered by (stream, size, address): the
    smallest block that fits, the lowest address among equal sizes, same stream only."""
    alloc = CachingAllocator()
    a = alloc.malloc(4 * MB)  # one 20 MiB segment: [a4][b2][c6][d2][rest6]
    alloc.malloc(2 * MB)
    c = alloc.malloc(6 * MB)
    alloc.malloc(2 * MB)
    alloc.free(a)
    alloc.free(c)
    e = alloc.malloc(5 * MB)  # 6 MiB blocks at c and at the end: c is lower
    assert e.addr == c.addr and e.size == 6 * MB  # 1 MiB remainder is not split off
    f = alloc.malloc(3 * MB)
    assert f.addr == a.addr and f.size == 4 * MB
    g = alloc.malloc(4 * MB, stream=7)  # nothing cached on stream 7: a new segment
    assert len(alloc.segments) == 2 and g.stream == 7
    alloc.free(g)
    h = alloc.malloc(4 * MB)  # stream 0 must not reuse stream 7's free block
    assert h.addr != g.addr


def test_merge_with_free_neighbours() -> None:
    """free_block / try_merge_blocks: a freed block merges with free neighbours;
    inactive_split counts the free blocks of split segments."""
    alloc = CachingAllocator()
    a, b, c = (alloc.malloc(2 * MB) for _ in range(3))
    stats = alloc.memory_stats
    alloc.free(a)
    assert (
        stats()["inactive_split.all.current"],
        stats()["inactive_split_bytes.all.current"],
    ) == (2, 16 * MB)
    alloc.free(c)  # merges with the 14 MiB tail
    assert (
        stats()["inactive_split.all.current"],
        stats()["inactive_split_bytes.all.current"],
    ) == (2, 18 * MB)
    alloc.free(b)  # merges both sides: one unsplit free segment
    assert (
        stats()["inactive_split.all.current"],
        stats()["inactive_split_bytes.all.current"],
    ) == (0, 0)
    assert layout(alloc) == [(20 * MB, [(20 * MB, "inactive")])]


def test_pending_free_until_completed() -> None:
    """free (block with stream_uses) and free_block at process_events: allocated bytes
    drop at the free request, the block stays active and unusable until completed."""
    alloc = CachingAllocator()
    a = alloc.malloc(1000)
    alloc.free_requested(a)
    assert layout(alloc)[0][1][0] == (1024, "active_pending_free")
    s = alloc.memory_stats()
    assert (
        s["allocated_bytes.all.current"] == 0 and s["active_bytes.all.current"] == 1024
    )
    b = alloc.malloc(1000)
    assert b.addr == a.addr + 1024  # a is not reusable yet
    alloc.free_completed(a)
    assert layout(alloc)[0][1][0] == (1024, "inactive")
    assert alloc.malloc(1000).addr == a.addr
    assert actions(alloc).count("free_completed") == 1


def test_oversize_blocks_and_max_split_size() -> None:
    """should_split / get_free_block with max_split_size: blocks >= it are never split,
    a normal request never takes one, an oversize request takes one only if it is
    less than max_non_split_rounding_size (20 MiB) larger."""
    alloc = CachingAllocator(AllocatorConfig.parse("max_split_size_mb:100"))
    a = alloc.malloc(150 * MB)
    alloc.free(a)
    b = alloc.malloc(50 * MB)
    assert b.addr != a.addr  # not carved out of the oversize block
    c = alloc.malloc(140 * MB)
    assert c.addr == a.addr and c.size == 150 * MB  # whole, unsplit
    alloc.free(c)
    d = alloc.malloc(120 * MB)  # 150 >= 120 + 20: refused, new segment
    assert d.addr != a.addr
    s = alloc.memory_stats()
    assert s["max_split_size"] == 100 * MB
    assert s["oversize_segments.current"] == 2  # 150 and 120 MiB
    assert s["oversize_allocations.current"] == 1


def test_release_available_cached_blocks_single() -> None:
    """release_available_cached_blocks: when cudaMalloc fails and max_split_size is
    set, free the smallest cached block >= max(size, max_split_size), no retry."""
    alloc = CachingAllocator(
        AllocatorConfig.parse("max_split_size_mb:100"), capacity=400 * MB
    )
    alloc.free(alloc.malloc(250 * MB))
    b = alloc.malloc(200 * MB)  # 250 >= 200+20 not reusable; 250+200 > 400
    assert not isinstance(b, OOM)
    s = alloc.memory_stats()
    assert s["num_alloc_retries"] == 0 and s["num_device_free"] == 1
    assert actions(alloc)[-3:] == ["segment_free", "segment_alloc", "alloc"]


def test_release_available_cached_blocks_several() -> None:
    """release_available_cached_blocks: no single block is big enough, so free the
    largest oversize blocks downwards until max(size, max_split_size) bytes are freed."""
    alloc = CachingAllocator(
        AllocatorConfig.parse("max_split_size_mb:100"), capacity=400 * MB
    )
    a, b = alloc.malloc(150 * MB), alloc.malloc(120 * MB)
    alloc.free(a)
    alloc.free(b)
    alloc.malloc(200 * MB)
    freed = [e[2] for e in alloc.trace if e[0] == "segment_free"]
    assert freed == [150 * MB, 120 * MB]
    assert alloc.memory_stats()["num_alloc_retries"] == 0


def test_release_cached_blocks_and_retry() -> None:
    """malloc retry path: release_cached_blocks frees every unsplit cached segment
    (after synchronizing pending frees), then alloc_block(isRetry) counts a retry."""
    alloc = CachingAllocator(capacity=60 * MB)
    a, b = alloc.malloc(20 * MB), alloc.malloc(20 * MB)
    alloc.free(a)
    alloc.free_requested(b)  # pending: completed by the synchronization
    c = alloc.malloc(30 * MB)
    assert not isinstance(c, OOM)
    s = alloc.memory_stats()
    assert s["num_alloc_retries"] == 1 and s["num_sync_all_streams"] == 1
    assert s["reserved_bytes.all.current"] == 30 * MB
    assert actions(alloc)[-5:] == [
        "free_completed",
        "segment_free",
        "segment_free",
        "segment_alloc",
        "alloc",
    ]


def test_oom_after_retry_with_fragmentation() -> None:
    """malloc OOM branch: split segments cannot be released, the retry fails,
    num_ooms counts, the trace gets an 'oom' entry with device_free."""
    alloc = CachingAllocator(capacity=40 * MB)
    x, _y, z = (alloc.malloc(5 * MB) for _ in range(3))  # [x5][y5][z5][5] in 20 MiB
    alloc.free(x)
    alloc.free(z)  # free: 5 MiB + 10 MiB (z merged with the tail)
    alloc.malloc(20 * MB)  # a second segment: 40 MiB reserved
    res = alloc.malloc(12 * MB)
    assert isinstance(res, OOM)
    assert (res.requested, res.reserved, res.device_free) == (12 * MB, 40 * MB, 0)
    assert (res.free_cached, res.largest_free_block, res.largest_free_in_pool) == (
        15 * MB,
        10 * MB,
        10 * MB,
    )
    s = alloc.memory_stats()
    assert s["num_ooms"] == 1 and s["num_alloc_retries"] == 1
    oom = alloc.snapshot().device_traces[0][-1]
    assert oom.action == "oom" and oom.device_free == 0 and oom.size == 12 * MB


def test_garbage_collection_threshold() -> None:
    """garbage_collect_cached_blocks: with a memory fraction set and reserved above
    threshold x allowed, before a new segment, release unsplit large cached blocks
    whose age (get_free_block calls since cached) is >= the mean age."""
    conf = AllocatorConfig.parse("garbage_collection_threshold:0.1")
    alloc = CachingAllocator(conf, capacity=1000 * MB, memory_fraction=1.0)
    for size in (20, 30, 40):  # cached at get_free_block calls 1, 2, 3
        alloc.free(alloc.malloc(size * MB))
    alloc.malloc(50 * MB)  # call 4: reserved 90 <= 100, no GC yet
    assert "segment_free" not in actions(alloc)
    alloc.malloc(
        60 * MB
    )  # call 5: reserved 140 > 100, target 40; ages 4, 3, 2 (mean 3)
    freed = [e[2] for e in alloc.trace if e[0] == "segment_free"]
    assert freed == [20 * MB, 30 * MB]  # 50 MiB reclaimed >= 40: the 40 MiB block stays
    assert alloc.memory_stats()["reserved_bytes.all.current"] == (40 + 50 + 60) * MB
    plain = CachingAllocator(conf, capacity=1000 * MB)  # no fraction: GC never runs
    for size in (20, 30, 40):
        plain.free(plain.malloc(size * MB))
    plain.malloc(50 * MB)
    plain.malloc(60 * MB)
    assert "segment_free" not in actions(plain)


def test_expandable_segments_grow_by_mapping() -> None:
    """try_allocate_expandable_block / map_block: one segment per stream and pool grows
    by mapping 20 MiB pages (large pool); should_split splits any remainder >= 512;
    no cudaMalloc, no segment count, no inactive_split."""
    alloc = CachingAllocator(AllocatorConfig.parse("expandable_segments:True"))
    a = alloc.malloc(5 * MB)
    b = alloc.malloc(30 * MB)  # grows over the free 15 MiB: maps one more page
    assert b.addr == a.addr + 5 * MB
    assert layout(alloc) == [
        (
            40 * MB,
            [
                (5 * MB, "active_allocated"),
                (30 * MB, "active_allocated"),
                (5 * MB, "inactive"),
            ],
        )
    ]
    assert actions(alloc).count("segment_map") == 2 and "segment_alloc" not in actions(
        alloc
    )
    assert alloc.snapshot().segments[0].is_expandable is True
    s = alloc.memory_stats()
    assert s["reserved_bytes.all.current"] == 40 * MB and s["segment.all.current"] == 0
    assert s["inactive_split_bytes.all.current"] == 0
    alloc.malloc(1000)  # small pool: its own expandable segment, 2 MiB pages
    assert sorted(x[0] for x in layout(alloc)) == [2 * MB, 40 * MB]


def test_expandable_segments_unmap_on_empty_cache() -> None:
    """release_blocks / unmap_block: free whole pages are unmapped; a segment with no
    mapped page left is released; partly used pages stay mapped."""
    alloc = CachingAllocator(AllocatorConfig.parse("expandable_segments:True"))
    a = alloc.malloc(5 * MB)
    b = alloc.malloc(30 * MB)
    alloc.free(b)
    alloc.empty_cache()  # page [20, 40) MiB is free: unmapped; [5, 20) stays
    assert layout(alloc) == [
        (20 * MB, [(5 * MB, "active_allocated"), (15 * MB, "inactive")])
    ]
    assert alloc.memory_stats()["reserved_bytes.all.current"] == 20 * MB
    alloc.free(a)
    alloc.empty_cache()
    assert layout(alloc) == [] and alloc.segments == {}
    assert actions(alloc).count("segment_unmap") == 2


def test_expandable_segments_oom_on_pages() -> None:
    """map_block: cuMemCreate fails when the device has no room for the pages needed."""
    alloc = CachingAllocator(
        AllocatorConfig.parse("expandable_segments:True"), capacity=50 * MB
    )
    res = alloc.malloc(45 * MB)  # needs three 20 MiB pages
    assert isinstance(res, OOM)
    assert alloc.memory_stats()["reserved_bytes.all.current"] == 0
    assert not isinstance(alloc.malloc(35 * MB), OOM)  # two pages fit


def test_memory_stats_names_match_torch() -> None:
    """DeviceStats as torch.cuda.memory_stats() flattens it (allocation.*, not allocated.*)."""
    s = CachingAllocator().memory_stats()
    for key in (
        "allocation.all.current",
        "segment.small_pool.peak",
        "active.large_pool.freed",
        "inactive_split_bytes.all.allocated",
        "requested_bytes.all.current",
        "num_alloc_retries",
        "num_ooms",
        "num_sync_all_streams",
        "num_device_alloc",
        "num_device_free",
    ):
        assert key in s
    assert s["max_split_size"] == -1


def test_peaks_track_the_high_water_mark() -> None:
    """increase_stat: peak = max(peak, current) on every increase."""
    alloc = CachingAllocator()
    blocks = [alloc.malloc(4 * MB) for _ in range(3)]
    for b in blocks:
        alloc.free(b)
    alloc.malloc(1 * MB)
    s = alloc.memory_stats()
    assert s["allocated_bytes.all.peak"] == 12 * MB
    assert s["allocated_bytes.all.current"] == 1 * MB
    assert s["allocation.all.allocated"] == 4 and s["allocation.all.freed"] == 3


def test_alloc_conf_parsing() -> None:
    """AllocatorConfig::parseArgs: known keys, torch's limits, unknown keys refused."""
    cfg = AllocatorConfig.parse("expandable_segments:True, max_split_size_mb:128")
    assert cfg.expandable_segments and cfg.max_split_size == 128 * MB
    assert (
        AllocatorConfig.parse(
            "garbage_collection_threshold:0.6"
        ).garbage_collection_threshold
        == 0.6
    )
    for bad in (
        "max_split_size_mb:10",
        "garbage_collection_threshold:1.5",
        "nonsense:1",
        "roundup_power2_divisions:3",
        "expandable_segments:yes",
        "max_split_size_mb",
    ):
        with pytest.raises(InputError):
            AllocatorConfig.parse(bad)


def test_snapshot_round_trip_through_load_segments() -> None:
    """snapshot(): segments and blocks as torch reports them; loading them back gives
    the same state and counters."""
    alloc = CachingAllocator()
    keep = [alloc.malloc(n) for n in (1000, 3 * MB, 700 * KB, 12 * MB)]
    alloc.free(keep[1])
    alloc.free_requested(keep[2])
    snap = alloc.snapshot()
    other = CachingAllocator()
    load_segments(other, snap.segments)
    assert other.snapshot().segments == snap.segments
    for key in (
        "allocated_bytes.all.current",
        "reserved_bytes.all.current",
        "active_bytes.all.current",
        "inactive_split_bytes.all.current",
        "segment.all.current",
        "requested_bytes.all.current",
    ):
        assert other.memory_stats()[key] == alloc.memory_stats()[key], key
