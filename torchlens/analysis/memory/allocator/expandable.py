"""Expandable segments: growing a segment by mapping pages instead of cudaMalloc.

Mirrors C++ ``find_expandable_block``, ``map_block``,
``try_allocate_expandable_block``, ``unmap_block`` and the expandable branch of
``release_blocks``. A pool's segment per stream is one reserved virtual range
(1 1/8 of the device's memory); blocks chain through it, mapped ones are
ordinary blocks, unmapped stretches sit in the pool's ``unmapped`` set. The
model keeps one rule of its own: when two neighbours merge, the lower-address
block object survives (C++ keeps the higher one and moves its pointer); the
layout is the same and segment heads stay stable.
"""

from __future__ import annotations

from torchlens.analysis.memory.allocator.config import (
    DEFAULT_DEVICE_TOTAL,
    LARGE_BUFFER,
    SMALL_BUFFER,
)
from torchlens.analysis.memory.allocator.device import ExpandableSegment
from torchlens.analysis.memory.allocator.heap import AllocatorHeap
from torchlens.analysis.memory.allocator.pool import Block, BlockPool, absorb


def _allocatable(b: Block | None) -> bool:
    return b is not None and not b.allocated and not b.pending


def _has_space(b: Block | None, size: int) -> bool:
    total = 0
    while total < size and _allocatable(b):
        assert b is not None
        total += b.size
        b = b.next
    return total >= size


def find_expandable_block(
    alloc: AllocatorHeap, pool: BlockPool, stream: int, size: int
) -> Block:
    """Lowest address with room for ``size`` (free + unmapped), else a new segment."""
    for addr in list(pool.unmapped_addrs.get(stream, ())):
        c = pool.unmapped[addr]
        if _allocatable(c.prev):
            c = c.prev  # type: ignore[assignment]
        if _has_space(c, size):
            return c
    page = SMALL_BUFFER if pool.is_small else LARGE_BUFFER
    total = alloc.capacity if alloc.capacity is not None else DEFAULT_DEVICE_TOTAL
    va = total + total // 8
    max_pages = -(-va // page)
    base = alloc.memory.malloc(max_pages * page)
    es = ExpandableSegment(base, page, max_pages)
    cand = Block(base, es.size, stream, pool, es)
    cand.mapped = False
    pool.insert_unmapped(cand)
    alloc.segments[base] = cand
    return cand


def map_block(alloc: AllocatorHeap, b: Block, size: int) -> Block | None:
    """Map pages at the start of unmapped ``b``; return the (merged) free block."""
    es: ExpandableSegment = b.es
    budget = None if alloc.capacity is None else alloc.capacity - alloc.total_reserved
    mapped = es.map(b.addr, size, budget)
    if mapped == 0:
        return None
    pool = b.pool
    pool.remove_unmapped(b)
    b.mapped = True
    start = b.addr
    if mapped < b.size:
        rem = Block(b.addr + mapped, b.size - mapped, b.stream, pool, es)
        rem.mapped = False
        rem.prev = b
        rem.next = b.next
        if b.next is not None:
            b.next.prev = rem
        b.next = rem
        pool.insert_unmapped(rem)
        b.size = mapped
    prev = b.prev
    if _allocatable(prev) and prev.mapped:  # type: ignore[union-attr]
        pool.remove(prev)  # type: ignore[arg-type]
        absorb(prev, b)  # type: ignore[arg-type]
        b = prev  # type: ignore[assignment]
    nxt = b.next
    if _allocatable(nxt) and nxt.mapped:  # type: ignore[union-attr]
        pool.remove(nxt)  # type: ignore[arg-type]
        absorb(b, nxt)  # type: ignore[arg-type]
    pool.insert(b)
    alloc.total_reserved += mapped
    alloc.stats.add("reserved_bytes", pool.is_small, mapped)
    alloc.stats.num_device_alloc += 1
    alloc.record("segment_map", start, mapped, b.stream)
    return b


def try_allocate_expandable(
    alloc: AllocatorHeap, pool: BlockPool, stream: int, size: int
) -> Block | None:
    """C++ ``try_allocate_expandable_block``: map pages until a free run fits ``size``."""
    c: Block | None = find_expandable_block(alloc, pool, stream, size)
    assert c is not None
    if not c.mapped:
        c = map_block(alloc, c, min(c.size, size))
        if c is None:
            return None
    while c.size < size:
        nxt = c.next
        assert nxt is not None and not nxt.mapped
        c = map_block(alloc, nxt, min(size - c.size, nxt.size))
        if c is None:
            return None
    pool.remove(c)
    return c


def unmap_block(alloc: AllocatorHeap, b: Block) -> Block:
    """C++ ``unmap_block``: give back the whole pages inside free block ``b``."""
    es: ExpandableSegment = b.es
    start, nbytes = es.unmap(b.addr, b.size)
    if nbytes == 0:
        return b
    pool = b.pool
    pool.remove(b)
    before = start - b.addr
    after = b.size - before - nbytes
    if before > 0:
        mid = Block(start, nbytes, b.stream, pool, es)
        mid.prev = b
        mid.next = b.next
        if b.next is not None:
            b.next.prev = mid
        b.next = mid
        b.size = before
        pool.insert(b)
    else:
        mid = b
        mid.size = nbytes
    if after > 0:
        aft = Block(start + nbytes, after, b.stream, pool, es)
        aft.prev = mid
        aft.next = mid.next
        if mid.next is not None:
            mid.next.prev = aft
        mid.next = aft
        pool.insert(aft)
    mid.mapped = False
    prev = mid.prev
    if prev is not None and not prev.mapped:
        pool.remove_unmapped(prev)
        absorb(prev, mid)
        mid = prev
    nxt = mid.next
    if nxt is not None and not nxt.mapped:
        pool.remove_unmapped(nxt)
        absorb(mid, nxt)
    pool.insert_unmapped(mid)
    alloc.total_reserved -= nbytes
    alloc.stats.sub("reserved_bytes", pool.is_small, nbytes)
    alloc.stats.num_device_free += 1
    alloc.record("segment_unmap", start, nbytes, b.stream)
    return mid


def release_expandable(alloc: AllocatorHeap, blocks: list[Block]) -> None:
    """Expandable branch of C++ ``release_blocks``: unmap free pages, drop empty segments."""
    for b in blocks:
        if b.pool.free.get(b.addr) is not b:
            continue  # merged away by an earlier unmap in this loop
        u = unmap_block(alloc, b)
        if u.prev is None and u.next is None and not u.mapped:
            u.pool.remove_unmapped(u)
            alloc.memory.free(u.addr, u.size)
            del alloc.segments[u.addr]
