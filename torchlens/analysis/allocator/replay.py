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
  out of memory by itself.

Allocations are identified by their real address in the trace; frees of an
allocation the model could not place (an OOM in simulate mode) are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .config import AllocatorConfig
from .core import OOM, CachingAllocator
from .pool import Block
from .state import load_segments


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

    @property
    def first_oom(self) -> OOM | None:
        return self.ooms[0][1] if self.ooms else None


def replay(
    events: Iterable[dict[str, Any]],
    config: AllocatorConfig | None = None,
    *,
    mode: str = "follow",
    capacity: int | None = None,
    memory_fraction: float | None = None,
    initial_segments: list[dict[str, Any]] | None = None,
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
        action = e["action"]
        if action == "alloc":
            total += 1
            real = e["addr"]
            b = malloc(e["size"], e.get("stream", 0))
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
            b = live.get(e["addr"])
            if b is None or not b.allocated:
                res.unknown_frees += 1
            else:
                free_requested(b)
        elif action == "free_completed" or action == "free":
            b = live.pop(e["addr"], None)
            if b is None:
                res.unknown_frees += 1
                continue
            if b.allocated:
                free_requested(b)  # a format without free_requested
            if b.pending:
                free_completed(b)
        elif action == "segment_alloc" or action == "segment_map":
            if follow:
                res.real_segment_allocs.append((e["addr"], e["size"]))
                hints.append((e["addr"], e["size"]))
        elif follow and action in ("segment_free", "segment_unmap"):
            if _apply_segment_release(alloc, e["addr"], e["size"]):
                res.forced_segment_frees += 1
        elif follow and action == "oom":
            alloc.stats.num_ooms += 1
    res.n_events = n
    res.allocs_total = total
    res.allocs_matched = matched
    return res


def _apply_segment_release(alloc: CachingAllocator, addr: int, size: int) -> bool:
    """Release the model's cached segment at ``addr`` if it is wholly free."""
    head = alloc.segments.get(addr)
    if head is not None and head.es is None:
        if head.next is None and head.pool.free.get(addr) is head:
            alloc._release_block(head)
            return True
        return False
    from .expandable import unmap_block

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
