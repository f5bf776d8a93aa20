"""How faithfully the model reproduces a real snapshot: replay its trace and compare.

For each snapshot with a trace: rebuild the state the trace started from
(``rebuild.rebuild_initial_state``; empty when the trace covers the whole
run), replay the trace in "follow" mode (segments take the real addresses;
every block choice, split and merge is the model's), then compare

- every allocation's address with the one the real allocator chose,
- the sequence of segment allocations (address, size),
- the final reserved, allocated and inactive_split bytes, and the whole final
  layout (every block's address, size and state), with the snapshot's segments.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from torchlens.analysis.memory.allocator.config import AllocatorConfig
from torchlens.analysis.memory.allocator.rebuild import rebuild_initial_state
from torchlens.analysis.memory.allocator.replay import replay
from torchlens.model.snapshot import Segment, Snapshot


@dataclass
class FidelityReport:
    """One snapshot's replay compared with reality."""

    name: str
    n_events: int
    allocs_matched: int
    allocs_total: int
    segment_sequence_equal: bool
    segment_allocs_real: int
    segment_allocs_model: int
    reserved_real: int
    reserved_model: int
    allocated_real: int
    allocated_model: int
    inactive_split_real: int
    inactive_split_model: int
    layout_equal: bool
    from_empty: bool
    notes: list[str] = field(default_factory=list)

    @property
    def address_match(self) -> float:
        return self.allocs_matched / self.allocs_total if self.allocs_total else 1.0

    @property
    def final_bytes_equal(self) -> bool:
        return (
            self.reserved_real == self.reserved_model
            and self.allocated_real == self.allocated_model
            and self.inactive_split_real == self.inactive_split_model
        )


def segment_bytes(segments: list[Segment]) -> tuple[int, int, int]:
    """(reserved, allocated, inactive_split) bytes of snapshot segments.

    inactive_split counts inactive blocks of non-expandable segments that hold
    more than one block, as C++ does (a block ``is_split`` when it has a
    neighbour; expandable segments are left out of that statistic).
    """
    reserved = allocated = inactive_split = 0
    for seg in segments:
        reserved += seg.total_size
        blocks = seg.blocks
        for b in blocks:
            if b.state == "active_allocated":
                allocated += b.size
            elif b.state == "inactive" and len(blocks) > 1 and not seg.is_expandable:
                inactive_split += b.size
    return reserved, allocated, inactive_split


def _layout(segments: list[Segment]) -> list[tuple]:
    return [
        (s.address, s.total_size, s.segment_type,
         tuple((b.address, b.size, b.state) for b in s.blocks))
        for s in sorted(segments, key=lambda s: s.address)
    ]


def check_fidelity(
    snapshot: Snapshot, name: str = "snapshot"
) -> FidelityReport | None:
    """Replay ``snapshot``'s first device trace and compare; None if it has no trace."""
    traced = [(i, t) for i, t in enumerate(snapshot.device_traces) if t]
    if not traced:
        return None
    device, trace = traced[0]  # device_traces holds one list per device, in order
    real_segs = [s for s in snapshot.segments if s.device == device]
    snapshot = msgspec.structs.replace(snapshot, segments=real_segs)
    cfg = AllocatorConfig.from_settings(snapshot.allocator_settings)
    init = rebuild_initial_state(snapshot, trace, cfg)
    res = replay(trace, cfg, mode="follow", initial_segments=init.segments or None)
    model = res.allocator.snapshot()
    r_res, r_alloc, r_split = segment_bytes(real_segs)
    m_res, m_alloc, m_split = segment_bytes(model.segments)
    model_seq = [(e[1], e[2]) for e in res.allocator.trace if e[0] == "segment_alloc"]
    notes = list(init.notes)
    if res.unused_hints:
        notes.append(
            f"{res.unused_hints} real segment allocations the model did not need"
        )
    if res.unknown_frees:
        notes.append(f"{res.unknown_frees} frees of allocations the replay never saw")
    if res.allocator.memory.hint_mismatches:
        notes.append(
            f"{res.allocator.memory.hint_mismatches} segments of another size than the real one"
        )
    if res.first_mismatch is not None:
        notes.append(f"first address mismatch at event {res.first_mismatch}")
    return FidelityReport(
        name=name,
        n_events=res.n_events,
        allocs_matched=res.allocs_matched,
        allocs_total=res.allocs_total,
        segment_sequence_equal=model_seq == res.real_segment_allocs,
        segment_allocs_real=len(res.real_segment_allocs),
        segment_allocs_model=len(model_seq),
        reserved_real=r_res,
        reserved_model=m_res,
        allocated_real=r_alloc,
        allocated_model=m_alloc,
        inactive_split_real=r_split,
        inactive_split_model=m_split,
        layout_equal=_layout(real_segs) == _layout(model.segments),
        from_empty=init.from_empty,
        notes=notes,
    )
