"""The allocator's retry path: giving cached memory back when a new segment
does not fit.

Mirrors C++ ``release_available_cached_blocks`` (oversize blocks, with
max_split_size set), ``release_cached_blocks`` (every unsplit cached segment,
also ``empty_cache``) and ``garbage_collect_cached_blocks`` (old large blocks,
with garbage_collection_threshold). ``CachingAllocator.malloc`` calls them in
C++'s order; each takes the allocator heap whose pools it frees.
"""

from __future__ import annotations

from bisect import bisect_left

from torchlens.analysis.memory.allocator.config import NO_MAX_SPLIT
from torchlens.analysis.memory.allocator.expandable import release_expandable
from torchlens.analysis.memory.allocator.heap import AllocatorHeap
from torchlens.analysis.memory.allocator.pool import ADDR_MASK, KEY_SHIFT, BlockPool


def release_available_cached_blocks(
    alloc: AllocatorHeap, pool: BlockPool, stream: int, size: int
) -> bool:
    """C++ ``release_available_cached_blocks``: free oversize cached blocks.

    Only with max_split_size set. Frees the smallest cached block of at
    least max(size, max_split_size); failing that, the largest oversize
    blocks downwards until that many bytes were freed.
    """
    mss = alloc.cfg.max_split_size
    if mss == NO_MAX_SPLIT:
        return False
    target = max(size, mss)
    keys = pool.keys.get(stream) or []
    i = bisect_left(keys, target << KEY_SHIFT)
    if i < len(keys):
        b = pool.free[keys[i] & ADDR_MASK]
        if b.is_split():
            return False  # C++ would cudaFree part of a segment; never happens with sane settings
        alloc.release_block(b)
        return True
    if i == 0:
        return False
    released = 0
    for key in reversed(keys[:i]):
        b = pool.free[key & ADDR_MASK]
        if released >= target or b.size < mss:
            break
        if b.is_split() or b.es is not None:
            continue
        released += b.size
        alloc.release_block(b)
    return released >= target


def release_cached_blocks(alloc: AllocatorHeap) -> None:
    """C++ ``release_cached_blocks`` (also ``empty_cache``): wait for pending
    frees, then release every unsplit cached segment of both pools."""
    alloc.stats.num_sync_all_streams += 1
    for b in list(alloc.pending.values()):
        b.pending = False
        del alloc.pending[b.addr]
        alloc.free_block(b)
    for pool in (alloc.large, alloc.small):
        to_unmap = []
        for b in pool.blocks_in_order():
            if b.es is not None:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                alloc.release_block(b)
        if to_unmap:
            release_expandable(alloc, to_unmap)


def garbage_collect(alloc: AllocatorHeap) -> None:
    """C++ ``garbage_collect_cached_blocks``: free old unsplit large blocks.

    Runs before a new segment is made, when reserved memory exceeds
    threshold x allowed memory; releases blocks whose age (get_free_block
    calls since they were cached) is at least the mean age, until enough
    is reclaimed. Expandable blocks are skipped (C++ asserts they never
    reach release_block).
    """
    assert alloc.allowed is not None
    threshold = int(alloc.cfg.garbage_collection_threshold * alloc.allowed)
    if alloc.total_reserved <= threshold:
        return
    target = alloc.total_reserved - threshold
    calls = alloc.large.gc_calls
    candidates = [
        b for b in alloc.large.blocks_in_order() if not b.is_split() and b.es is None
    ]
    if not candidates:
        return
    total_age = sum(calls - b.gc_base for b in candidates)
    count = len(candidates)
    reclaimed = 0
    freed_one = True
    while reclaimed < target and freed_one and count > 0:
        age_threshold = total_age / count
        freed_one = False
        for b in alloc.large.blocks_in_order():
            if b.is_split() or b.es is not None:
                continue
            age = calls - b.gc_base
            if age >= age_threshold:
                freed_one = True
                reclaimed += b.size
                total_age -= age
                count -= 1
                alloc.release_block(b)
