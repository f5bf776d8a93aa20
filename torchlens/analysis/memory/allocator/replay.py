"""Replaying an allocator trace (a snapshot's ``device_traces`` entry) through the model.

Two modes:

- ``"follow"``: reproduce what a real allocator did. New segments take the
  addresses the real driver returned (the ``segment_alloc`` / ``segment_map``
  entries that precede each allocation are fed to the model's device memory
  as hints), ``segment_free`` / ``segment_unmap`` entries are applied as
  ``empty_cache`` would, and recorded OOMs are counted. Every other decision
  (which block, where to split, what merges) is the model's own, so a
  matching address means the model chose like the real allocator.
- ``"simulate"``: "what if". Only the program's requests (alloc, free) are
  taken from the trace; the model decides everything else under its own
  settings and capacity, inventing addresses, releasing caches and running
  out of memory by itself. The one release it takes from the trace is the
  program's own ``torch.cuda.empty_cache()``: a run of ``segment_free`` /
  ``segment_unmap`` entries (not ending in an ``oom``) releases every fully
  free cached segment, as ``emptyCache`` does (see ``empty_cache_points``).

Allocations are identified by their real address in the trace; frees of an
allocation the model could not place (an OOM in simulate mode) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from torchlens.analysis.memory.allocator.config import AllocatorConfig
from torchlens.analysis.memory.allocator.core import OOM, CachingAllocator
from torchlens.analysis.memory.allocator.expandable import unmap_block
from torchlens.analysis.memory.allocator.pool import Block
from torchlens.analysis.memory.allocator.state import load_segments
from torchlens.model.snapshot import Segment, TraceEntry


@dataclass
class ReplayResult:
    """What a replay did, for fidelity checks and "what if" reports."""

    allocator: CachingAllocator
    mode: str
    n_events: int = 0
    allocs_total: int = 0
    allocs_matched: int = 0  # model address == address in the trace
    first_mismatch: int | None = None  # index of the first alloc at another address
    ooms: list[tuple[int, OOM]] = field(default_factory=list)  # (event index, figures)
    unknown_frees: int = 0  # frees of allocations the replay never saw
    real_segment_allocs: list[tuple[int, int]] = field(default_factory=list)
    unused_hints: int = 0  # real segment_allocs the model did not need
    forced_segment_frees: int = 0  # segment_free entries applied in follow mode
    empty_caches: int = 0  # the program's empty_cache calls applied in simulate mode

    @property
    def first_oom(self) -> OOM | None:
        return self.ooms[0][1] if self.ooms else None


def replay(
    events: Iterable[TraceEntry],
    config: AllocatorConfig | None = None,
    *,
    mode: str = "follow",
    capacity: int | None = None,
    memory_fraction: float | None = None,
    initial_segments: list[Segment] | None = None,
    record_history: bool = True,
) -> ReplayResult:
    """Run ``events`` (trace entries) through a fresh allocator; see the module doc."""
    if mode not in ("follow", "simulate"):
        raise ValueError(f"mode must be 'follow' or 'simulate', not {mode!r}")
    alloc = CachingAllocator(
        config,
        capacity=capacity,
        memory_fraction=memory_fraction,
        record_history=record_history,
    )
    live: dict[int, Block] = {}
    empty_cache_at: set[int] = set()
    if mode == "simulate":
        events = events if isinstance(events, list) else list(events)
        empty_cache_at = empty_cache_points(events)
    if initial_segments:
        live.update(load_segments(alloc, initial_segments))
    res = ReplayResult(alloc, mode)
    follow = mode == "follow"
    hints = alloc.memory.hints
    malloc = alloc.malloc
    free_requested = alloc.free_requested
    free_completed = alloc.free_completed
    n = 0
    matched = 0
    total = 0
    for i, e in enumerate(events):
        n += 1
        action = e.action
        if action == "alloc":
            total += 1
            real = e.addr
            b = malloc(e.size, e.stream)
            if type(b) is OOM:
                res.ooms.append((i, b))
            else:
                live[real] = b  # type: ignore[assignment]
                if b.addr == real:  # type: ignore[union-attr]
                    matched += 1
                elif res.first_mismatch is None:
                    res.first_mismatch = i
            if hints:
                res.unused_hints += len(hints)
                hints.clear()
        elif action == "free_requested":
            b = live.get(e.addr)
            if b is None or not b.allocated:
                res.unknown_frees += 1
            else:
                free_requested(b)
        elif action == "free_completed" or action == "free":
            b = live.pop(e.addr, None)
            if b is None:
                res.unknown_frees += 1
                continue
            if b.allocated:
                free_requested(b)  # a format without free_requested
            if b.pending:
                free_completed(b)
        elif action == "segment_alloc" or action == "segment_map":
            if follow:
                res.real_segment_allocs.append((e.addr, e.size))
                hints.append((e.addr, e.size))
        elif follow and action in ("segment_free", "segment_unmap"):
            if _apply_segment_release(alloc, e.addr, e.size):
                res.forced_segment_frees += 1
        elif i in empty_cache_at:
            alloc.empty_cache()
            res.empty_caches += 1
        elif follow and action == "oom":
            alloc.stats.num_ooms += 1
    res.n_events = n
    res.allocs_total = total
    res.allocs_matched = matched
    return res


def empty_cache_points(events: list[TraceEntry]) -> set[int]:
    """Indices of the trace entries where the program called ``empty_cache``.

    The first entry of each run of ``segment_free`` / ``segment_unmap`` not
    followed at once by an ``oom``. A run followed by a new segment may also
    be the allocator's own release-and-retry inside one malloc, which releases
    the same (every fully free cached segment); only garbage collection and
    max_split_size releases free fewer, so there the model releases more.
    A run that ends in an ``oom`` is the failing retry: the model decides
    that one by itself.
    """
    out: set[int] = set()
    start: int | None = None
    for i, e in enumerate(events):
        a = e.action
        if a == "segment_free" or a == "segment_unmap":
            if start is None:
                start = i
        elif start is not None:
            if a != "oom":
                out.add(start)
            start = None
    if start is not None:
        out.add(start)
    return out


def _apply_segment_release(alloc: CachingAllocator, addr: int, size: int) -> bool:
    """Release the model's cached segment at ``addr`` if it is wholly free."""
    head = alloc.segments.get(addr)
    if head is not None and head.es is None:
        if head.next is None and head.pool.free.get(addr) is head:
            alloc.release_block(head)
            return True
        return False
    for base, h in alloc.segments.items():
        if h.es is None or not base <= addr < base + h.es.size:
            continue
        b: Block | None = h
        while b is not None:
            if (
                b.mapped
                and b.addr <= addr < b.addr + b.size
                and b.pool.free.get(b.addr) is b
            ):
                unmap_block(alloc, b)
                return True
            b = b.next
    return False
