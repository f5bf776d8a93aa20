"""The allocator state a trace started from, rebuilt from the trace and the final snapshot.

``_record_memory_history`` is usually switched on after the model's weights
are on the GPU, and its ring buffer (``max_entries``) drops the oldest entries,
so a snapshot's trace rarely starts from an empty allocator. Replaying it
from empty would put the first allocations in the wrong places. The starting
state is rebuilt like this:

1. Segments. A segment of the final snapshot existed at the start unless the
   trace allocates it (``segment_alloc``, and no later ``segment_free``).
   A ``segment_free`` of a segment the trace never allocated adds a starting
   segment the final snapshot no longer has (its size is in the entry).
2. Live blocks at the start are (a) the final snapshot's active blocks that
   the trace did not allocate: untouched for the whole window, so their
   address, size and requested size are exact; and (b) blocks the trace frees
   without having allocated them: their address and requested size are in
   the free entry, their block size is inferred (the rounded request; in the
   large pool extended over a following gap of at most 1 MiB, because the
   allocator never leaves a cached large-pool block that small, it keeps the
   remainder in the block instead of splitting).
   A ``free_completed`` with no ``free_requested`` is a free that was pending
   when the window opened (state ``active_pending_free``).
3. Free blocks at the start are the gaps between live blocks, one inactive
   block per gap: the allocator merges free neighbours on every free, so two
   free blocks are never adjacent (pending-free blocks are live, above).

What it costs in fidelity: with no blocks of kind (b) the rebuilt layout is
the real one, block for block, and the replay can match every address. Each
(b) block whose inferred size is wrong (a block that absorbed a remainder and
whose following neighbour was freed later) shifts best-fit choices until it
is freed. Counters start at the state's current values: peaks, cumulative
counts and the age of cached blocks (for garbage collection) from before the
window are unknown. Expandable segments are rebuilt with their final mapped
extent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from torchlens.analysis.memory.allocator.config import (
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocatorConfig,
    round_size,
)
from torchlens.model.snapshot import Segment, SnapBlock, Snapshot, TraceEntry


@dataclass
class InitialState:
    """Segments the trace started from, and how they were found."""

    segments: list[Segment]
    from_empty: bool
    n_segments: int = 0
    n_exact_blocks: int = 0  # live at start, taken from the final snapshot
    n_inferred_blocks: int = 0  # live at start, size inferred from a free entry
    notes: list[str] = field(default_factory=list)


def _walk_trace(trace: Sequence[TraceEntry]) -> tuple[dict, dict, set, dict]:
    live: dict[int, int] = {}  # addr -> requested, allocated inside the trace
    pre_freed: dict[int, tuple[int, bool]] = {}  # addr -> (requested, pending at start)
    created: set[int] = set()
    pre_segments: dict[int, int] = {}
    requested_seen: set[int] = set()
    for e in trace:
        a = e.action
        addr = e.addr
        if a == "alloc":
            live[addr] = e.size
        elif a == "free_requested":
            if addr in live:
                requested_seen.add(addr)
            elif addr not in pre_freed:
                pre_freed[addr] = (e.size, False)
                requested_seen.add(addr)
        elif a in ("free_completed", "free"):
            if addr in live:
                del live[addr]
                requested_seen.discard(addr)
            elif addr in requested_seen:
                requested_seen.discard(addr)
            elif addr not in pre_freed:
                pre_freed[addr] = (e.size, a == "free_completed")
        elif a == "segment_alloc":
            created.add(addr)
        elif a == "segment_free":
            if addr in created:
                created.discard(addr)
            else:
                pre_segments.setdefault(addr, e.size)
    return live, pre_freed, created, pre_segments


#: a starting block: address, size, requested size, state and, when its size was
#: inferred from a free entry (it may have kept a remainder), a trailing True
_Live = tuple


def rebuild_initial_state(
    snapshot: Snapshot,
    trace: Sequence[TraceEntry] | None = None,
    config: AllocatorConfig | None = None,
) -> InitialState:
    """Rebuild the state ``trace`` (default: the snapshot's first device trace) started from."""
    cfg = config or AllocatorConfig.from_settings(snapshot.allocator_settings)
    if trace is None:
        traces = snapshot.device_traces
        trace = traces[0] if traces else []
    live_end, pre_freed, created, pre_segments = _walk_trace(trace)
    state = InitialState([], True)
    shells: list[tuple[Segment, list[_Live]]] = []
    for seg in snapshot.segments:
        if seg.address in created:
            continue
        start_blocks: list[_Live] = [
            (b.address, b.size, b.requested_size, b.state)
            for b in seg.blocks
            if b.state != "inactive"
            and b.address not in live_end
            and b.address not in pre_freed
        ]
        state.n_exact_blocks += len(start_blocks)
        shells.append((seg, start_blocks))
        if seg.is_expandable:
            state.notes.append(
                f"expandable segment 0x{seg.address:x} rebuilt with its final mapped size"
            )
    for addr, size in pre_segments.items():
        shells.append((Segment(addr, size, 0, 0, 0,
                               segment_type="small" if size <= SMALL_BUFFER else "large"), []))
    shells.sort(key=lambda s: s[0].address)
    starts = [s.address for s, _ in shells]
    unplaced = 0
    from bisect import bisect_right

    for addr, (req, pending) in pre_freed.items():
        i = bisect_right(starts, addr) - 1
        if i < 0 or addr >= starts[i] + shells[i][0].total_size:
            unplaced += 1
            continue
        state_name = "active_pending_free" if pending else "active_allocated"
        shells[i][1].append((addr, round_size(req, cfg), req, state_name, True))
        state.n_inferred_blocks += 1
    for seg, shell_live in shells:
        live = sorted(shell_live)
        end = seg.address + seg.total_size
        small = seg.segment_type == "small"
        blocks = []
        cursor = seg.address
        for k, item in enumerate(live):
            addr, size, req, st = item[:4]
            nxt = live[k + 1][0] if k + 1 < len(live) else end
            if len(item) == 5 and not small:
                gap = nxt - (addr + size)
                if 0 < gap <= SMALL_SIZE or (
                    size >= cfg.max_split_size
                    and 0 < gap < cfg.max_non_split_rounding_size
                ):
                    size += gap  # the allocator kept that remainder inside the block
            if addr + size > nxt:
                state.notes.append(f"block 0x{addr:x} overlaps its neighbour; clipped")
                size = nxt - addr
            if addr > cursor:
                blocks.append(SnapBlock(cursor, addr - cursor, 0, "inactive"))
            blocks.append(SnapBlock(addr, size, req, st))
            cursor = addr + size
        if cursor < end:
            blocks.append(SnapBlock(cursor, end - cursor, 0, "inactive"))
        state.segments.append(msgspec.structs.replace(seg, blocks=blocks))
    state.n_segments = len(state.segments)
    state.from_empty = not state.segments
    if unplaced:
        state.notes.append(f"{unplaced} freed blocks lie in no known segment; ignored")
    if state.segments:
        state.notes.append(
            f"trace starts mid-run: {state.n_segments} segments existed before it; "
            f"{state.n_exact_blocks} live blocks taken from the final snapshot, "
            f"{state.n_inferred_blocks} inferred from free entries"
        )
    return state
