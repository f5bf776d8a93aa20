"""Blocks and the ordered pools of cached free blocks.

C++ keeps free blocks in a ``std::set`` ordered by (stream, size, address) and
best fit is ``lower_bound``. Here each pool keeps, per stream, a sorted Python
list of integer keys ``size << 64 | address`` searched with ``bisect``: one
integer comparison per probe instead of a tuple comparison, and insertion is a
``memmove`` of a list that stays in the thousands. That keeps a million-event
replay within seconds without a C extension or third-party sorted container.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Any

KEY_SHIFT = 64
ADDR_MASK = (1 << KEY_SHIFT) - 1


class Block:
    """A contiguous range of one segment: allocated, pending free, or cached."""

    __slots__ = (
        "addr",
        "size",
        "requested",
        "stream",
        "pool",
        "prev",
        "next",
        "allocated",
        "pending",
        "es",
        "mapped",
        "gc_base",
    )

    def __init__(
        self, addr: int, size: int, stream: int, pool: BlockPool, es: Any = None
    ) -> None:
        self.addr = addr
        self.size = size
        self.requested = 0
        self.stream = stream
        self.pool = pool
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        #: freed by the program but not yet reusable (free_requested seen,
        #: free_completed not yet): C++ ``event_count > 0``.
        self.pending = False
        self.es = es
        self.mapped = True
        self.gc_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def state(self) -> str:
        if self.allocated:
            return "active_allocated"
        if self.pending:
            return "active_pending_free"
        return "inactive"

    def __repr__(self) -> str:
        return (
            f"Block(0x{self.addr:x}, {self.size}, {self.state()}, stream={self.stream})"
        )


def absorb(low: Block, high: Block) -> None:
    """Merge ``high`` into its lower neighbour ``low`` (C++ ``try_merge_blocks``)."""
    low.size += high.size
    low.next = high.next
    if high.next is not None:
        high.next.prev = low


class BlockPool:
    """Cached free blocks of one pool (small or large), best fit by (stream, size, address)."""

    __slots__ = ("is_small", "keys", "free", "unmapped_addrs", "unmapped", "gc_calls")

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        #: stream -> sorted keys (size << 64 | addr) of free mapped blocks
        self.keys: dict[int, list[int]] = {}
        #: addr -> free mapped block
        self.free: dict[int, Block] = {}
        #: stream -> sorted addresses of unmapped (expandable) ranges
        self.unmapped_addrs: dict[int, list[int]] = {}
        self.unmapped: dict[int, Block] = {}
        #: C++ get_free_blocks_call_count (ages blocks for garbage collection)
        self.gc_calls = 0

    def insert(self, b: Block) -> None:
        """Cache a free block (C++ insert_into_blocks: also stamps its gc age)."""
        b.gc_base = self.gc_calls
        lst = self.keys.get(b.stream)
        if lst is None:
            lst = self.keys[b.stream] = []
        insort(lst, (b.size << KEY_SHIFT) | b.addr)
        self.free[b.addr] = b

    def remove(self, b: Block) -> None:
        lst = self.keys[b.stream]
        key = (b.size << KEY_SHIFT) | b.addr
        i = bisect_left(lst, key)
        if i >= len(lst) or lst[i] != key:
            raise AssertionError(f"block {b!r} is not cached in this pool")
        del lst[i]
        del self.free[b.addr]

    def contains(self, b: Block) -> bool:
        return self.free.get(b.addr) is b

    def blocks_in_order(self) -> list[Block]:
        """All cached blocks in C++ set order (stream, size, address)."""
        out = []
        for stream in sorted(self.keys):
            out.extend(self.free[k & ADDR_MASK] for k in self.keys[stream])
        return out

    def insert_unmapped(self, b: Block) -> None:
        lst = self.unmapped_addrs.get(b.stream)
        if lst is None:
            lst = self.unmapped_addrs[b.stream] = []
        insort(lst, b.addr)
        self.unmapped[b.addr] = b

    def remove_unmapped(self, b: Block) -> None:
        lst = self.unmapped_addrs[b.stream]
        i = bisect_left(lst, b.addr)
        if i >= len(lst) or lst[i] != b.addr:
            raise AssertionError(f"block {b!r} is not an unmapped range of this pool")
        del lst[i]
        del self.unmapped[b.addr]

    def total_free(self) -> int:
        return sum(b.size for b in self.free.values())

    def largest_free(self) -> int:
        best = 0
        for lst in self.keys.values():
            if lst:
                best = max(best, lst[-1] >> KEY_SHIFT)
        return best
