"""What the caching allocator asks of the driver: device addresses and pages.

``DeviceMemory`` stands in for cudaMalloc/cudaFree and cuMemAddressReserve:
it hands out virtual addresses for new segments. When replaying a real trace
("follow" mode) the replay feeds it the addresses the real driver returned
(``segment_alloc`` / ``segment_map`` entries) as hints, so the model's blocks
land at the real addresses; otherwise ("simulate" mode) it invents addresses,
lowest free range first, 2 MiB aligned, in a region that looks like a CUDA
heap. Physical capacity is checked by the allocator, not here, because
cudaMalloc fails on bytes, not on address space.

``ExpandableSegment`` models one cuMemAddressReserve'd range mapped in pages
(2 MiB for the small pool, 20 MiB for the large pool), as in C++ Note
[Expandable Segments].
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque

#: Where invented segments start (a typical CUDA VA on Linux, 2 MiB aligned).
DEFAULT_BASE = 0x7F0000000000
ALIGN = 2 * 1024 * 1024


class DeviceMemory:
    """A virtual-address allocator for segments, with optional real-address hints."""

    def __init__(self, base: int = DEFAULT_BASE) -> None:
        self.next_addr = base
        self.free_ranges: list[tuple[int, int]] = []  # sorted (addr, size)
        self.hints: deque[tuple[int, int]] = deque()
        self.hint_mismatches = 0
        self.invented: set[int] = set()

    def claim(self, addr: int, size: int) -> None:
        """Keep invented addresses clear of a range that already exists."""
        end = addr + size
        if end > self.next_addr:
            self.next_addr = -(-end // ALIGN) * ALIGN

    def malloc(self, size: int) -> int:
        """Address for a new segment of ``size`` bytes (a hint first, if any)."""
        if self.hints:
            addr, hsize = self.hints.popleft()
            if hsize != size:
                self.hint_mismatches += 1
            return addr
        size_a = -(-size // ALIGN) * ALIGN
        for i, (addr, rsize) in enumerate(self.free_ranges):
            if rsize >= size_a:
                if rsize == size_a:
                    del self.free_ranges[i]
                else:
                    self.free_ranges[i] = (addr + size_a, rsize - size_a)
                self.invented.add(addr)
                return addr
        addr = self.next_addr
        self.next_addr += size_a
        self.invented.add(addr)
        return addr

    def free(self, addr: int, size: int) -> None:
        """Return a segment's range (coalescing neighbours, as a VA allocator does)."""
        if addr not in self.invented:
            return  # a real (hinted or loaded) address: nothing to reuse
        self.invented.discard(addr)
        size_a = -(-size // ALIGN) * ALIGN
        insort(self.free_ranges, (addr, size_a))
        i = bisect_left(self.free_ranges, (addr, size_a))
        if i + 1 < len(self.free_ranges):
            a, s = self.free_ranges[i]
            na, ns = self.free_ranges[i + 1]
            if a + s == na:
                self.free_ranges[i : i + 2] = [(a, s + ns)]
        if i > 0:
            pa, ps = self.free_ranges[i - 1]
            a, s = self.free_ranges[i]
            if pa + ps == a:
                self.free_ranges[i - 1 : i + 1] = [(pa, ps + s)]
        if self.free_ranges and sum(self.free_ranges[-1]) == self.next_addr:
            self.next_addr = self.free_ranges.pop()[0]


class ExpandableSegment:
    """A reserved virtual range whose pages are mapped on demand."""

    __slots__ = ("base", "page", "max_pages", "mapped")

    def __init__(self, base: int, page: int, max_pages: int) -> None:
        self.base = base
        self.page = page
        self.max_pages = max_pages
        self.mapped: list[bool] = []

    @property
    def size(self) -> int:
        return self.page * self.max_pages

    def _left(self, p: int) -> int:
        return (p - self.base) // self.page

    def _right(self, p: int) -> int:
        return -(-(p - self.base) // self.page)

    def map(self, ptr: int, size: int, budget: int | None) -> int:
        """Map the pages covering [ptr, ptr+size); return bytes mapped (0 = out of memory).

        ``budget`` is the physical memory still available; C++ creates pages one
        by one and releases the ones it made if the device runs out, so a
        partial map never survives.
        """
        begin, end = self._left(ptr), self._right(ptr + size)
        if begin == end:
            return 0
        nbytes = (end - begin) * self.page
        if budget is not None and nbytes > budget:
            return 0
        while len(self.mapped) < end:
            self.mapped.append(False)
        for i in range(begin, end):
            if self.mapped[i]:
                raise AssertionError("expandable segment: mapping a page twice")
            self.mapped[i] = True
        return nbytes

    def unmap(self, ptr: int, size: int) -> tuple[int, int]:
        """Unmap the whole pages inside [ptr, ptr+size); return (start, bytes)."""
        begin, end = self._right(ptr), self._left(ptr + size)
        if begin >= end:
            return ptr, 0
        for i in range(begin, end):
            self.mapped[i] = False
        while self.mapped and not self.mapped[-1]:
            self.mapped.pop()
        return self.base + begin * self.page, (end - begin) * self.page
