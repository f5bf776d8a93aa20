"""What a caching allocator holds, and the moves every part of it makes.

``AllocatorHeap`` is one device's pools, segments, pending frees, counters and
trace, with the three primitive moves that the malloc path (``core``), the
retry path (``release``), expandable segments (``expandable``) and snapshot
import/export (``state``) all make: put a freed block back into its pool
(C++ ``free_block``), give a whole cached segment back to the device (C++
``release_block``) and record a trace event. Those modules take a heap;
``core.CachingAllocator`` is a heap with the malloc path on top, so none of
them needs ``core``.
"""

from __future__ import annotations

from torchlens.analysis.memory.allocator.config import (
    DEFAULT_DEVICE_TOTAL,
    AllocatorConfig,
)
from torchlens.analysis.memory.allocator.device import DeviceMemory
from torchlens.analysis.memory.allocator.pool import Block, BlockPool, absorb
from torchlens.analysis.memory.allocator.stats import (
    Stats,
    count_free_completed,
    dec,
    hot_tuples,
    inc,
)


class AllocatorHeap:
    """One device's allocator state: pools, segments, counters and trace."""

    def __init__(
        self,
        config: AllocatorConfig | None = None,
        *,
        capacity: int | None = None,
        memory_fraction: float | None = None,
        device: int = 0,
        record_history: bool = True,
    ) -> None:
        self.cfg = config or AllocatorConfig()
        self.capacity = capacity
        self.device = device
        self.small = BlockPool(True)
        self.large = BlockPool(False)
        #: allocated or pending-free blocks by address
        self.active: dict[int, Block] = {}
        #: freed, awaiting free_completed (C++ events)
        self.pending: dict[int, Block] = {}
        self.segments: dict[int, Block] = {}  # base address -> first block
        self.total_reserved = 0  # C++ total_allocated_memory
        self.stats = Stats()
        self._hot = {True: hot_tuples(self.stats, 1), False: hot_tuples(self.stats, 2)}
        self.memory = DeviceMemory()
        self.record_history = record_history
        self.trace: list[tuple[str, int, int, int]] = []
        self.allowed: int | None = None
        if memory_fraction is not None:
            self.set_memory_fraction(memory_fraction)

    # ---------------------------------------------------------------- settings
    def set_memory_fraction(self, fraction: float) -> None:
        """C++ setMemoryFraction: also what arms garbage collection."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("memory fraction must be within [0, 1]")
        total = self.capacity if self.capacity is not None else DEFAULT_DEVICE_TOTAL
        self.allowed = int(fraction * total)

    @property
    def gc_enabled(self) -> bool:
        return self.allowed is not None and self.cfg.garbage_collection_threshold > 0.0

    def record(self, action: str, addr: int, size: int, stream: int) -> None:
        """Append one trace event (when history is recorded)."""
        if self.record_history:
            self.trace.append((action, addr, size, stream))

    # ------------------------------------------------------- primitive moves
    def _split_change(self, pi: int, nblocks: int, nbytes: int) -> None:
        """Apply a net change to inactive_split / inactive_split_bytes (all + pool)."""
        st = self.stats.arrays
        for name, amount in (
            ("inactive_split", nblocks),
            ("inactive_split_bytes", nbytes),
        ):
            if amount > 0:
                arr = st[name]
                inc(arr[0], amount)
                inc(arr[pi], amount)
            elif amount < 0:
                arr = st[name]
                dec(arr[0], -amount)
                dec(arr[pi], -amount)

    def free_block(self, b: Block) -> None:
        """C++ ``free_block``: a block whose free completed goes back to its pool,
        merged with its free neighbours."""
        if self.record_history:
            self.trace.append(("free_completed", b.addr, b.requested, b.stream))
        pool = b.pool
        orig_size = b.size
        requested = b.requested
        del self.active[b.addr]
        net_blocks = 0
        net_bytes = 0
        prev = b.prev
        if prev is not None and not prev.allocated and not prev.pending and prev.mapped:
            pool.remove(prev)
            net_blocks -= 1
            net_bytes -= prev.size
            absorb(prev, b)
            prev.requested = requested
            b = prev  # the lower block survives, so segment heads never change
        nxt = b.next
        if nxt is not None and not nxt.allocated and not nxt.pending and nxt.mapped:
            pool.remove(nxt)
            net_blocks -= 1
            net_bytes -= nxt.size
            absorb(b, nxt)
        pool.insert(b)
        if b.prev is not None or b.next is not None:
            net_blocks += 1
            net_bytes += b.size
        if b.es is None and (net_blocks or net_bytes):
            # C++ leaves expandable segments out of inactive_split
            self._split_change(1 if pool.is_small else 2, net_blocks, net_bytes)
        count_free_completed(self._hot[pool.is_small], orig_size, requested)

    def release_block(self, b: Block) -> None:
        """C++ ``release_block``: cudaFree a whole cached segment."""
        self.stats.num_device_free += 1
        self.record("segment_free", b.addr, b.size, b.stream)
        self.memory.free(b.addr, b.size)
        self.total_reserved -= b.size
        self.stats.sub("segment", b.pool.is_small, 1)
        self.stats.sub("reserved_bytes", b.pool.is_small, b.size)
        if b.size >= self.cfg.max_split_size:
            dec(self.stats.oversize_segments, 1)
        b.pool.remove(b)
        del self.segments[b.addr]


__all__ = ["AllocatorHeap"]
