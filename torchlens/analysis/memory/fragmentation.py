"""Fragmentation figures from an allocator snapshot (pure functions, no torch).

These answer "why did it run out of memory while nvidia-smi shows free
memory": how much of the reserved memory is cached but free, how big the
largest free block is (per pool: small-pool blocks never serve large
requests), how much is stranded in split segments (``inactive_split``, by
torch's own definition, which only an allocation that fits the gap or a merge
can reuse), and which share of
reserved memory is free but useless for a given request size.

Input is a ``Snapshot`` as ``torchlens.model.snapshot.load_snapshot`` returns
(or the model's ``CachingAllocator.snapshot()``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torchlens.analysis.memory.allocator.config import (
    SMALL_SIZE,
    AllocatorConfig,
    round_size,
)
from torchlens.model.snapshot import Segment, Snapshot


@dataclass
class FragmentationSummary:
    """Byte and count figures of one snapshot (optionally one device)."""

    reserved: int = 0
    allocated: int = 0
    active: int = 0  # allocated + freed but pending (stream uses)
    requested: int = 0  # what the program asked for in active blocks
    pending_free: int = 0
    free_cached: int = 0  # inactive blocks: reserved but reusable by the allocator
    largest_free_block: int = 0
    largest_free: dict[str, int] = field(
        default_factory=lambda: {"small": 0, "large": 0}
    )
    free_by_pool: dict[str, int] = field(
        default_factory=lambda: {"small": 0, "large": 0}
    )
    #: bytes of free blocks torch counts as ``inactive_split``: a free block with a
    #: neighbour (C++ ``Block::is_split()``), i.e. every free block of a segment
    #: with more than one block, except in expandable segments, which
    #: ``free_block`` leaves out of the stat on purpose ("any fully free page
    #: within an expandable segment can always be safely released";
    #: ``if (!block->expandable_segment_)`` around the stat update)
    inactive_split: int = 0
    inactive_split_blocks: int = 0
    #: free bytes in expandable segments: cached, not in torch's inactive_split
    free_expandable: int = 0
    #: ``inactive_split_bytes.all.current`` of ``memory_stats()`` when measured on CUDA
    torch_inactive_split: int | None = None
    n_segments: int = 0
    n_segments_by_pool: dict[str, int] = field(
        default_factory=lambda: {"small": 0, "large": 0}
    )
    n_expandable_segments: int = 0
    n_blocks: int = 0
    n_allocated_blocks: int = 0
    n_pending_blocks: int = 0
    n_inactive_blocks: int = 0

    @property
    def free_share(self) -> float:
        """Share of reserved memory that is cached and free."""
        return self.free_cached / self.reserved if self.reserved else 0.0


def _segments(snapshot: Snapshot, device: int | None) -> list[Segment]:
    segs = snapshot.segments
    if device is None:
        return list(segs)
    return [s for s in segs if s.device == device]


def summarize(
    snapshot: Snapshot, device: int | None = None
) -> FragmentationSummary:
    """All figures of ``snapshot`` in one pass (``device=None``: every device)."""
    out = FragmentationSummary()
    for seg in _segments(snapshot, device):
        pool = "small" if seg.segment_type == "small" else "large"
        blocks = seg.blocks
        expandable = seg.is_expandable
        out.reserved += seg.total_size
        out.n_segments += 1
        out.n_segments_by_pool[pool] += 1
        out.n_expandable_segments += expandable
        split = len(blocks) > 1 and not expandable
        for b in blocks:
            size = b.size
            state = b.state
            out.n_blocks += 1
            if state == "inactive":
                out.n_inactive_blocks += 1
                out.free_cached += size
                out.free_by_pool[pool] += size
                if size > out.largest_free[pool]:
                    out.largest_free[pool] = size
                if expandable:
                    out.free_expandable += size
                if split:
                    out.inactive_split += size
                    out.inactive_split_blocks += 1
                continue
            out.active += size
            out.requested += b.requested_size
            if state == "active_allocated":
                out.allocated += size
                out.n_allocated_blocks += 1
            else:
                out.pending_free += size
                out.n_pending_blocks += 1
    out.largest_free_block = max(out.largest_free.values())
    return out


def can_serve(
    block_size: int, request: int, config: AllocatorConfig | None = None
) -> bool:
    """Whether a cached free block of ``block_size`` could serve a request (C++ get_free_block).

    The block must be in the request's pool (this function gets sizes only:
    the caller keeps pools apart), at least the rounded size, and obey the
    oversize rules of max_split_size.
    """
    cfg = config or AllocatorConfig()
    size = round_size(request, cfg)
    if block_size < size:
        return False
    mss = cfg.max_split_size
    if size < mss and block_size >= mss:
        return False
    return not (size >= mss and block_size >= size + cfg.max_non_split_rounding_size)


def unusable_free_share(
    snapshot: Snapshot,
    request: int,
    *,
    stream: int | None = None,
    device: int | None = None,
    config: AllocatorConfig | None = None,
) -> float:
    """Share of reserved bytes that are free yet cannot serve a ``request``-byte allocation.

    Free bytes in blocks of the other pool, of another stream (when ``stream``
    is given), too small, or ruled out by max_split_size count as unusable.
    This is the figure behind "out of memory with gigabytes reserved but free":
    1.0 - (usable free + used) / reserved. Growth of expandable segments is not
    counted as free (it is not reserved yet).
    """
    cfg = config or AllocatorConfig.from_settings(snapshot.allocator_settings)
    want_small = round_size(request, cfg) <= SMALL_SIZE
    reserved = unusable = 0
    for seg in _segments(snapshot, device):
        reserved += seg.total_size
        seg_small = seg.segment_type == "small"
        other = seg_small != want_small or (
            stream is not None and seg.stream != stream
        )
        for b in seg.blocks:
            if b.state != "inactive":
                continue
            if other or not can_serve(b.size, request, cfg):
                unusable += b.size
    return unusable / reserved if reserved else 0.0


@dataclass(frozen=True, slots=True)
class MapBlock:
    """One block of the segment map: where it starts (and from the segment's start),
    its size, the bytes asked for and its state."""

    address: int
    offset: int
    size: int
    requested_size: int
    state: str


@dataclass(frozen=True, slots=True)
class SegmentMap:
    """One row of the segment map: a segment, its allocated and free bytes, its blocks."""

    device: int
    address: int
    total_size: int
    segment_type: str
    stream: int
    is_expandable: bool
    allocated: int
    free: int
    blocks: list[MapBlock]


def segment_map(snapshot: Snapshot, device: int | None = None) -> list[SegmentMap]:
    """Segments sorted by address with their blocks, offsets and states, for drawing."""
    rows = []
    for seg in sorted(_segments(snapshot, device), key=lambda s: (s.device, s.address)):
        base = seg.address
        blocks = [MapBlock(b.address, b.address - base, b.size, b.requested_size, b.state)
                  for b in seg.blocks]
        rows.append(SegmentMap(
            seg.device, base, seg.total_size, seg.segment_type, seg.stream,
            seg.is_expandable,
            sum(b.size for b in blocks if b.state == "active_allocated"),
            sum(b.size for b in blocks if b.state == "inactive"), blocks))
    return rows


def largest_request_that_fits(
    snapshot: Snapshot, *, stream: int | None = None, device: int | None = None
) -> dict[str, int]:
    """Largest cached free block per pool (what can be allocated without a new segment)."""
    best = {"small": 0, "large": 0}
    for seg in _segments(snapshot, device):
        if stream is not None and seg.stream != stream:
            continue
        pool = "small" if seg.segment_type == "small" else "large"
        for b in seg.blocks:
            if b.state == "inactive" and b.size > best[pool]:
                best[pool] = b.size
    return best
