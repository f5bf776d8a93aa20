"""Moving allocator state in and out of torch's snapshot format.

``export_snapshot`` writes what ``torch.cuda.memory._snapshot()`` would: the
segments (one per cudaMalloc, or per contiguous mapped range of an expandable
segment, as C++ ``snapshot()`` reports them) with their blocks and states, the
trace, and the settings, so torch's own ``_memory_viz`` and the memory_viz web
page read the model's output like a real one.

``load_segments`` does the reverse: it puts an allocator into the state a
snapshot's segments describe, so a replay can start mid-run or a "what if"
can continue from a real snapshot.
"""

from __future__ import annotations

from torchlens.analysis.memory.allocator.config import LARGE_BUFFER, SMALL_BUFFER
from torchlens.analysis.memory.allocator.device import ExpandableSegment
from torchlens.analysis.memory.allocator.heap import AllocatorHeap
from torchlens.analysis.memory.allocator.pool import Block
from torchlens.analysis.memory.allocator.stats import inc
from torchlens.model.snapshot import Segment, SnapBlock, Snapshot, TraceEntry


def _segment(alloc: AllocatorHeap, head: Block, blocks: list[Block]) -> Segment:
    total = allocated = active = requested = 0
    out_blocks = []
    for b in blocks:
        state = b.state()
        total += b.size
        if state == "active_allocated":
            allocated += b.size
        if state != "inactive":
            active += b.size
            requested += b.requested
        out_blocks.append(SnapBlock(b.addr, b.size, b.requested, state))
    return Segment(blocks[0].addr, total, allocated, active, requested, device=alloc.device,
                   stream=head.stream, segment_type="small" if head.pool.is_small else "large",
                   is_expandable=head.es is not None, blocks=out_blocks)


def export_snapshot(alloc: AllocatorHeap) -> Snapshot:
    """The allocator's state as a snapshot (segments sorted by address)."""
    segments = []
    for head in alloc.segments.values():
        run: list[Block] = []
        b: Block | None = head
        while b is not None:
            if b.mapped:
                run.append(b)
            elif run:
                segments.append(_segment(alloc, head, run))
                run = []
            b = b.next
        if run:
            segments.append(_segment(alloc, head, run))
    segments.sort(key=lambda s: s.address)
    trace = []
    for entry in alloc.trace:
        action, addr, size, stream = entry
        if action == "oom":  # the model records the free bytes where an address goes
            trace.append(TraceEntry(action, 0, size, stream, device_free=addr))
        else:
            trace.append(TraceEntry(action, addr, size, stream))
    return Snapshot(segments, [trace], alloc.cfg.to_settings(), [])


def load_segments(
    alloc: AllocatorHeap, segments: list[Segment]
) -> dict[int, Block]:
    """Rebuild ``segments`` (normalized snapshot segments) inside an empty allocator.

    Returns the live blocks (allocated or pending free) by address. Counters
    start at the state's current values (peaks = current; what happened
    before is unknown). An expandable snapshot segment becomes its own
    expandable segment based at its address with its pages mapped: torch
    reports each mapped range separately and does not say which ranges share
    one reservation.
    """
    if alloc.segments:
        raise ValueError("load_segments needs an empty allocator")
    live: dict[int, Block] = {}
    st = alloc.stats
    for seg in sorted(segments, key=lambda s: s.address):
        small = seg.segment_type == "small"
        pool = alloc.small if small else alloc.large
        stream = seg.stream
        es = None
        if seg.is_expandable:
            page = SMALL_BUFFER if small else LARGE_BUFFER
            npages = -(-seg.total_size // page)
            es = ExpandableSegment(seg.address, page, max(npages * 2, 1))
            es.mapped = [True] * npages
        prev: Block | None = None
        head: Block | None = None
        chain = []
        for rb in seg.blocks:
            b = Block(rb.address, rb.size, stream, pool, es)
            b.requested = rb.requested_size
            b.prev = prev
            if prev is not None:
                prev.next = b
            prev = b
            head = head or b
            chain.append((b, rb.state))
        if head is None:
            continue
        if es is not None:
            tail_addr = seg.address + seg.total_size
            tail = Block(tail_addr, es.size - seg.total_size, stream, pool, es)
            tail.mapped = False
            tail.prev = prev
            assert prev is not None
            prev.next = tail
            pool.insert_unmapped(tail)
        alloc.segments[head.addr] = head
        alloc.memory.claim(seg.address, es.size if es else seg.total_size)
        alloc.total_reserved += seg.total_size
        if es is None:
            st.add("segment", small, 1)
        st.add("reserved_bytes", small, seg.total_size)
        for b, state in chain:
            if state == "inactive":
                pool.insert(b)
                if es is None and b.is_split():
                    st.add("inactive_split", small, 1)
                    st.add("inactive_split_bytes", small, b.size)
                continue
            alloc.active[b.addr] = b
            live[b.addr] = b
            st.add("active", small, 1)
            st.add("active_bytes", small, b.size)
            st.add("requested_bytes", small, b.requested)
            if state == "active_allocated":
                b.allocated = True
                st.add("allocation", small, 1)
                st.add("allocated_bytes", small, b.size)
                if b.size >= alloc.cfg.max_split_size:
                    inc(st.oversize_allocations, 1)
            else:
                b.pending = True
                alloc.pending[b.addr] = b
    for arr in st.arrays.values():
        for s in arr:
            s[2] = s[3] = 0  # cumulative counts before the state are unknown
    return live
