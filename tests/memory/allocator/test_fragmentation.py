"""Fragmentation figures, checked against values computed here from the raw segments."""

from __future__ import annotations

from pathlib import Path

import pytest
from allocator_fixtures import SNAPSHOT_PARAMS, SNAPSHOTS, load_cached

from torchlens.analysis.memory.allocator import AllocatorConfig, CachingAllocator
from torchlens.analysis.memory.fragmentation import (
    can_serve,
    largest_request_that_fits,
    segment_map,
    summarize,
    unusable_free_share,
)
from torchlens.model.snapshot import SnapBlock, Snapshot

MB = 1024 * 1024


def _blocks(
    snap: Snapshot, pool: str | None = None, state: str | None = None
) -> list[SnapBlock]:
    return [
        b
        for s in snap.segments
        if pool is None or s.segment_type == pool
        for b in s.blocks
        if state is None or b.state == state
    ]


@pytest.mark.parametrize("path", SNAPSHOT_PARAMS)
def test_summary_matches_raw_segments(path: Path) -> None:
    snap = load_cached(path)
    summary = summarize(snap)
    segs = snap.segments
    # the real allocator's own per-segment figures
    assert summary.reserved == sum(s.total_size for s in segs)
    assert summary.allocated == sum(s.allocated_size for s in segs)
    assert summary.active == sum(s.active_size for s in segs)
    assert summary.requested == sum(s.requested_size for s in segs)
    free = _blocks(snap, state="inactive")
    assert summary.free_cached == sum(b.size for b in free)
    assert summary.free_cached == summary.reserved - summary.active
    for pool in ("small", "large"):
        sizes = [b.size for b in _blocks(snap, pool, "inactive")]
        assert summary.largest_free[pool] == max(sizes, default=0)
        assert summary.free_by_pool[pool] == sum(sizes)
        assert summary.n_segments_by_pool[pool] == sum(
            s.segment_type == pool for s in segs
        )
    assert summary.largest_free_block == max((b.size for b in free), default=0)
    split = [
        b
        for s in segs
        if len(s.blocks) > 1 and not s.is_expandable
        for b in s.blocks
        if b.state == "inactive"
    ]
    assert summary.inactive_split == sum(b.size for b in split)
    assert summary.inactive_split_blocks == len(split)
    assert summary.n_blocks == sum(len(s.blocks) for s in segs)
    assert (
        summary.n_allocated_blocks
        + summary.n_pending_blocks
        + summary.n_inactive_blocks
        == summary.n_blocks
    )
    assert summary.n_expandable_segments == sum(bool(s.is_expandable) for s in segs)


@pytest.mark.parametrize("path", SNAPSHOT_PARAMS)
@pytest.mark.parametrize("request_size", [4096, 2 * MB, 30 * MB, 500 * MB])
def test_unusable_free_share(path: Path, request_size: int) -> None:
    snap = load_cached(path)
    want_small = request_size <= 1 * MB
    reserved = sum(s.total_size for s in snap.segments)
    # default settings in these snapshots: a free block serves iff same pool and big enough
    usable = sum(
        b.size
        for s in snap.segments
        if (s.segment_type == "small") == want_small
        for b in s.blocks
        if b.state == "inactive" and b.size >= request_size
    )
    free = sum(b.size for b in _blocks(snap, state="inactive"))
    expected = (free - usable) / reserved
    if snap.allocator_settings.get("max_split_size", -1) in (-1, None):
        assert unusable_free_share(snap, request_size) == pytest.approx(expected)
    assert 0.0 <= unusable_free_share(snap, request_size) <= 1.0


def test_expandable_snapshot_figures() -> None:
    """expandable_segments_no_trace: free blocks of expandable segments are not
    inactive_split; max_split_size 128 MiB comes from its settings."""
    snap = load_cached(SNAPSHOTS / "expandable_segments_no_trace.pickle")
    summary = summarize(snap)
    assert summary.n_expandable_segments == 2
    assert summary.inactive_split == 0
    assert summary.free_cached == 512 + 2090496 + 7135232 + 5316608
    assert summary.largest_free == {"small": 2090496, "large": 7135232}
    cfg = AllocatorConfig.from_settings(snap.allocator_settings)
    assert cfg.max_split_size == 128 * MB and cfg.expandable_segments
    # 6 MiB request: only the 7135232-byte block can hold it
    share = unusable_free_share(snap, 6 * MB)
    assert share == pytest.approx((summary.free_cached - 7135232) / summary.reserved)


def test_segment_map_rows() -> None:
    snap = load_cached(SNAPSHOTS / "segments_only.pickle")
    rows = segment_map(snap)
    assert [r.address for r in rows] == sorted(
        s.address for s in snap.segments
    )
    for row in rows:
        assert sum(b.size for b in row.blocks) == row.total_size
        assert row.blocks[0].offset == 0
        offsets = [b.offset for b in row.blocks]
        sizes = [b.size for b in row.blocks]
        assert offsets[1:] == [o + s for o, s in zip(offsets, sizes, strict=False)][:-1]
        assert row.allocated + row.free <= row.total_size


def test_largest_request_per_stream() -> None:
    snap = load_cached(SNAPSHOTS / "ctx128_fullstep.pickle")
    assert largest_request_that_fits(snap, stream=0) == summarize(snap).largest_free
    assert largest_request_that_fits(snap, stream=12345) == {"small": 0, "large": 0}


def test_can_serve_oversize_rules() -> None:
    """get_free_block oversize rules as seen from a free block's size."""
    cfg = AllocatorConfig.parse("max_split_size_mb:100")
    assert can_serve(30 * MB, 20 * MB, cfg)
    assert not can_serve(150 * MB, 20 * MB, cfg)  # normal request, oversize block
    assert can_serve(150 * MB, 140 * MB, cfg)
    assert not can_serve(150 * MB, 120 * MB, cfg)  # 150 >= 120 + 20
    assert not can_serve(10 * MB, 20 * MB, cfg)


def test_figures_of_a_model_state_agree_with_its_counters() -> None:
    """summarize() on the model's snapshot equals the model's memory_stats."""
    alloc = CachingAllocator()
    blocks = [
        alloc.malloc(n) for n in (1000, 3 * MB, 700 * 1024, 12 * MB, 5 * MB, 2000)
    ]
    alloc.free(blocks[1])
    alloc.free(blocks[5])
    alloc.free_requested(blocks[2])
    s = alloc.memory_stats()
    summary = summarize(alloc.snapshot())
    assert summary.reserved == s["reserved_bytes.all.current"]
    assert summary.allocated == s["allocated_bytes.all.current"]
    assert summary.active == s["active_bytes.all.current"]
    assert summary.inactive_split == s["inactive_split_bytes.all.current"]
    assert summary.inactive_split_blocks == s["inactive_split.all.current"]
    assert summary.n_segments == s["segment.all.current"]
