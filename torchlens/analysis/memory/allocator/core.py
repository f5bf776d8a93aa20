"""A replay model of PyTorch's CUDA caching allocator (one device).

Written from the rules of c10/cuda/CUDACachingAllocator.cpp
(``DeviceCachingAllocator``): each method below names the C++ function whose
decisions it reproduces (the retry path's in ``release``, expandable
segments' in ``expandable``). What is modelled: size rounding and
roundup_power2_divisions, small/large pools and their segment sizes, best fit
by (stream, size, address), the split rules, oversize blocks and
max_split_size, merging with free neighbours, frees that complete later
(``free_requested`` -> ``free_completed``), the retry path (release one or more
oversize cached blocks, then every unsplit cached block, counting
``num_alloc_retries``), OOM against a capacity or a memory fraction,
garbage_collection_threshold and expandable segments. CUDA graph private pools,
IPC and multi-device peer access are not modelled: they do not change a single
process's default-pool layout.

Why a model at all: on a CPU-only machine it says what the GPU allocator would
have done with a cell's allocations, and on a GPU it answers "what if" (other
settings, a smaller card) from a recorded trace without re-running.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from torchlens.analysis.memory.allocator.config import (
    DEFAULT_DEVICE_TOTAL,
    LARGE_BUFFER,
    MIN_BLOCK_SIZE,
    NO_MAX_SPLIT,
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocatorConfig,
    allocation_size,
    round_size,
)
from torchlens.analysis.memory.allocator.expandable import try_allocate_expandable
from torchlens.analysis.memory.allocator.heap import AllocatorHeap
from torchlens.analysis.memory.allocator.pool import (
    ADDR_MASK,
    KEY_SHIFT,
    Block,
    BlockPool,
)
from torchlens.analysis.memory.allocator.release import (
    garbage_collect,
    release_available_cached_blocks,
    release_cached_blocks,
)
from torchlens.analysis.memory.allocator.state import export_snapshot
from torchlens.analysis.memory.allocator.stats import (
    count_alloc,
    count_free_requested,
    dec,
    inc,
)
from torchlens.model.snapshot import Snapshot


@dataclass
class OOM:
    """An allocation the allocator could not satisfy, with the figures that explain it."""

    requested: int  # bytes the program asked for
    size: int  # after rounding
    alloc_size: int  # segment size it tried to cudaMalloc
    stream: int
    pool: str  # "small" or "large"
    device_free: int  # capacity (or allowed) minus reserved
    reserved: int
    allocated: int
    free_cached: int  # cached free bytes in both pools after the retry path
    largest_free_block: int  # largest cached free block (any pool, any stream)
    largest_free_in_pool: int  # largest cached block the request could use
    capacity: int | None


class CachingAllocator(AllocatorHeap):
    """One device's caching allocator; see the module docstring for the scope.

    Its state and primitive moves are ``heap.AllocatorHeap``'s; this class adds
    the malloc and free paths, the OOM report and the reporting calls."""

    def __init__(
        self,
        config: AllocatorConfig | None = None,
        *,
        capacity: int | None = None,
        memory_fraction: float | None = None,
        device: int = 0,
        record_history: bool = True,
    ) -> None:
        super().__init__(config, capacity=capacity, memory_fraction=memory_fraction,
                         device=device, record_history=record_history)
        # settings are read once, here (torch reads PYTORCH_CUDA_ALLOC_CONF at start)
        self._plain_rounding = not any(self.cfg.roundup_power2_divisions)

    # ------------------------------------------------------------------ malloc
    def malloc(self, orig_size: int, stream: int = 0) -> Block | OOM:
        """C++ ``malloc``: find, or make room for, a block of ``orig_size`` bytes."""
        if self._plain_rounding:  # no roundup_power2_divisions: round to 512 B
            size = 512 if orig_size < 512 else (orig_size + 511) & ~511
        else:
            size = round_size(orig_size, self.cfg)
        pool = self.small if size <= SMALL_SIZE else self.large
        block = self._get_free_block(pool, stream, size)
        if block is None:
            alloc_size = allocation_size(size)
            if self.gc_enabled:
                garbage_collect(self)
            block = self._alloc_block(pool, stream, size, alloc_size, False)
            if block is None and release_available_cached_blocks(
                self, pool, stream, size
            ):
                block = self._alloc_block(pool, stream, size, alloc_size, False)
            if block is None:
                release_cached_blocks(self)
                block = self._alloc_block(pool, stream, size, alloc_size, True)
            if block is None:
                return self._oom(orig_size, size, alloc_size, stream, pool)
        return self._alloc_found_block(
            block, size, orig_size, self._should_split(block, size)
        )

    def _get_free_block(self, pool: BlockPool, stream: int, size: int) -> Block | None:
        """C++ ``get_free_block``: best fit, with the oversize and expandable rules."""
        if self.allowed is not None and self.cfg.garbage_collection_threshold > 0.0:
            pool.gc_calls += 1
        keys = pool.keys.get(stream)
        if not keys:
            return None
        i = bisect_left(keys, size << KEY_SHIFT)
        n = len(keys)
        if i == n:
            return None
        free = pool.free
        b = free[keys[i] & ADDR_MASK]
        if b.es is not None:
            if self.cfg.expandable_segments:
                # best fit counts what an expandable block can grow into
                j = i + 1
                while b.es is not None and j < n:
                    nb = free[keys[j] & ADDR_MASK]
                    if _expandable_size(nb) < _expandable_size(b):
                        b, i = nb, j
                        j += 1
                    else:
                        break
            else:
                # expandable segments switched off: skip blocks that are in one
                i += 1
                while i < n and free[keys[i] & ADDR_MASK].es is not None:
                    i += 1
                if i == n:
                    return None
                b = free[keys[i] & ADDR_MASK]
        mss = self.cfg.max_split_size
        if size < mss and b.size >= mss:
            return None  # do not hand out an oversize block for a normal request
        if size >= mss and b.size >= size + self.cfg.max_non_split_rounding_size:
            return None  # oversize blocks only serve requests close to their size
        del keys[i]
        del free[b.addr]
        return b

    def _should_split(self, b: Block, size: int) -> bool:
        """C++ ``should_split``."""
        remaining = b.size - size
        if b.pool.is_small or self.cfg.expandable_segments:
            return remaining >= MIN_BLOCK_SIZE
        return size < self.cfg.max_split_size and remaining > SMALL_SIZE

    def _alloc_found_block(
        self, b: Block, size: int, orig_size: int, split: bool
    ) -> Block:
        """C++ ``alloc_found_block``: split off the remainder, mark allocated, count."""
        pool = b.pool
        small = pool.is_small
        pi = 1 if small else 2
        already_split = b.prev is not None or b.next is not None
        if split:
            rem = Block(b.addr + size, b.size - size, b.stream, pool, b.es)
            rem.requested = b.requested
            rem.prev = b
            rem.next = b.next
            if b.next is not None:
                b.next.prev = rem
            b.next = rem
            b.size = size
            pool.insert(rem)
            if b.es is None:
                if already_split:
                    # an already split free block shrinks by ``size``
                    self._split_change(pi, 0, -size)
                else:
                    # a new split: the remainder becomes an inactive split block
                    self._split_change(pi, 1, rem.size)
        elif already_split and b.es is None:
            self._split_change(pi, -1, -b.size)
        b.allocated = True
        b.requested = orig_size
        if self.record_history:
            self.trace.append(("alloc", b.addr, orig_size, b.stream))
        self.active[b.addr] = b
        bsize = b.size
        count_alloc(self._hot[small], bsize, orig_size)
        if bsize >= self.cfg.max_split_size:
            inc(self.stats.oversize_allocations, 1)
        return b

    # -------------------------------------------------------------------- free
    def free(self, b: Block, stream_uses: bool = False) -> None:
        """C++ ``free``: a block used on other streams completes later, else now."""
        self.free_requested(b)
        if not stream_uses:
            self.free_completed(b)

    def free_requested(self, b: Block) -> None:
        """The program dropped the block: it stops counting as allocated, not as active."""
        if not b.allocated:
            raise ValueError(f"{b!r} is not allocated")
        b.allocated = False
        b.pending = True
        self.pending[b.addr] = b
        count_free_requested(self._hot[b.pool.is_small], b.size)
        if self.record_history:
            self.trace.append(("free_requested", b.addr, b.requested, b.stream))
        if b.size >= self.cfg.max_split_size:
            dec(self.stats.oversize_allocations, 1)

    def free_completed(self, b: Block) -> None:
        """The block's stream work is done: it becomes reusable (C++ ``free_block``)."""
        if not b.pending:
            raise ValueError(f"{b!r} has no pending free")
        b.pending = False
        del self.pending[b.addr]
        self.free_block(b)

    # ----------------------------------------------------- segments and retry
    def _alloc_block(
        self, pool: BlockPool, stream: int, size: int, alloc_size: int, is_retry: bool
    ) -> Block | None:
        """C++ ``alloc_block``: a new segment (cudaMalloc) or expandable growth."""
        if is_retry:
            self.stats.num_alloc_retries += 1
        if self.allowed is not None and self.total_reserved + alloc_size > self.allowed:
            return None
        if self.cfg.expandable_segments:
            return try_allocate_expandable(self, pool, stream, size)
        if (
            self.capacity is not None
            and self.total_reserved + alloc_size > self.capacity
        ):
            return None  # cudaMalloc: cudaErrorMemoryAllocation
        addr = self.memory.malloc(alloc_size)
        self.total_reserved += alloc_size
        b = Block(addr, alloc_size, stream, pool)
        self.segments[addr] = b
        self.stats.add("segment", pool.is_small, 1)
        self.stats.add("reserved_bytes", pool.is_small, alloc_size)
        if alloc_size >= self.cfg.max_split_size:
            inc(self.stats.oversize_segments, 1)
        self.stats.num_device_alloc += 1
        self.record("segment_alloc", addr, alloc_size, stream)
        return b

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``."""
        release_cached_blocks(self)

    def _oom(
        self, orig: int, size: int, alloc_size: int, stream: int, pool: BlockPool
    ) -> OOM:
        """C++ OOM branch of ``malloc``: count it, trace it, report the figures."""
        total = self.capacity if self.capacity is not None else DEFAULT_DEVICE_TOTAL
        device_free = max(0, total - self.total_reserved)
        self.stats.num_ooms += 1
        if self.record_history:
            self.trace.append(("oom", device_free, size, stream))
        keys = pool.keys.get(stream) or []
        return OOM(
            requested=orig,
            size=size,
            alloc_size=alloc_size,
            stream=stream,
            pool="small" if pool.is_small else "large",
            device_free=device_free,
            reserved=self.total_reserved,
            allocated=self.stats.current("allocated_bytes"),
            free_cached=self.small.total_free() + self.large.total_free(),
            largest_free_block=max(
                self.small.largest_free(), self.large.largest_free()
            ),
            largest_free_in_pool=(keys[-1] >> KEY_SHIFT) if keys else 0,
            capacity=self.capacity,
        )

    # ------------------------------------------------------------ reporting
    def memory_stats(self) -> dict[str, int]:
        """Counters with ``torch.cuda.memory_stats()`` keys."""
        mss = self.cfg.max_split_size
        return self.stats.as_dict(-1 if mss == NO_MAX_SPLIT else mss)

    def snapshot(self) -> Snapshot:
        """The state as a snapshot (see ``state.export_snapshot``)."""
        return export_snapshot(self)


def _expandable_size(b: Block) -> int:
    nxt = b.next
    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


__all__ = ["OOM", "CachingAllocator", "SMALL_BUFFER", "LARGE_BUFFER"]
