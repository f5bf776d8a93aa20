"""The caching-allocator model applied to a cell's trace: reserved memory and "what if".

Two uses, one function (``run_model``):

- A CPU-only capture has allocations but no CUDA segments; replaying its
  requests through the model (simulate mode) says what the GPU allocator
  would have reserved, how it would have fragmented, and whether it would
  have run out of memory on a card of ``capacity`` bytes.
- A real GPU snapshot replayed under another setting or a smaller card gives
  the side-by-side "what if" (``compare``).

A real trace usually starts mid-run; its starting segments are rebuilt from
the final snapshot (``allocator.rebuild_initial_state``) so the simulated
figures include the memory that was already there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torchlens.analysis.memory import fragmentation
from torchlens.analysis.memory.allocator import (
    OOM,
    AllocatorConfig,
    CachingAllocator,
    rebuild_initial_state,
    replay,
)
from torchlens.analysis.memory.allocator.replay import ReplayResult
from torchlens.analysis.memory.timeline import SEG_ADD, SEG_SUB
from torchlens.model.snapshot import Snapshot, TraceEntry
from torchlens.model.units import format_bytes

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2,
          "MIB": 1024**2, "G": 1024**3, "GB": 1024**3, "GIB": 1024**3, "T": 1024**4,
          "TB": 1024**4, "TIB": 1024**4}


def parse_size(text: str) -> int:
    """``"24GiB"``, ``"512MB"``, ``"1e9"`` -> bytes (binary units: GB means GiB, as nvidia-smi)."""
    s = str(text).strip().upper().replace(" ", "")
    num = s.rstrip("KMGTIB")
    unit = s[len(num):]
    try:
        value = float(num)
    except ValueError:
        value = -1.0
    if unit not in _UNITS or not 0 < value * _UNITS.get(unit, 1) < 2**63:  # nan fails too
        raise ValueError(f"{text!r}: expected a size such as 24GiB, 512MiB or 8e9 "
                         "(a finite number of bytes below 8 EiB)")
    return int(value * _UNITS[unit])


@dataclass
class ModelRun:
    """What the model did with a trace: final snapshot, counters and per-event reserved."""

    config: AllocatorConfig
    capacity: int | None
    snapshot: Snapshot
    stats: dict[str, int]  # torch's memory_stats() counters, by name
    ooms: list[tuple[int, OOM]] = field(default_factory=list)  # (trace index, figures)
    reserved_steps: list[tuple[int, int]] = field(default_factory=list)  # (trace index, bytes)
    skipped_frees: int = 0
    notes: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, int]:
        """The comparison row: reserved, allocated, peaks, inactive_split, OOMs, retries."""
        return _stat_figures(self.stats)


def _stat_figures(st: Mapping[str, int]) -> dict[str, int]:
    return {
        "reserved": st.get("reserved_bytes.all.current", 0),
        "allocated": st.get("allocated_bytes.all.current", 0),
        "peak_reserved": st.get("reserved_bytes.all.peak", 0),
        "peak_allocated": st.get("allocated_bytes.all.peak", 0),
        "inactive_split": st.get("inactive_split_bytes.all.current", 0),
        "ooms": st.get("num_ooms", 0),
        "retries": st.get("num_alloc_retries", 0),
    }


def run_model(
    trace: list[TraceEntry],
    config: AllocatorConfig | None = None,
    *,
    capacity: int | None = None,
    start_snapshot: Snapshot | None = None,
) -> ModelRun:
    """Replay the program's requests of ``trace`` in simulate mode.

    ``start_snapshot``: the real final snapshot the trace belongs to; its
    starting state is rebuilt and loaded first. Without it the model starts
    empty (a CPU capture).
    """
    cfg = config or AllocatorConfig()
    notes: list[str] = []
    initial = None
    if start_snapshot is not None and start_snapshot.segments:
        init = rebuild_initial_state(start_snapshot, trace)
        initial = init.segments or None
        notes += init.notes
    res = replay(trace, cfg, mode="simulate", capacity=capacity, initial_segments=initial)
    alloc = res.allocator
    # Reserved only changes inside malloc (new segments, the release-and-retry
    # path), so walking the model's history beside the trace's allocs gives the
    # reserved bytes after each of them.
    alloc_idx = [i for i, e in enumerate(trace) if e.action == "alloc"]
    start_reserved = reserved = sum(s.total_size for s in (initial or []))
    steps: list[tuple[int, int]] = []
    k = 0
    for action, _addr, size, _stream in alloc.trace:
        if action in SEG_ADD:
            reserved += size
        elif action in SEG_SUB:
            reserved -= size
        elif action in ("alloc", "oom") and k < len(alloc_idx):
            steps.append((alloc_idx[k], reserved))
            k += 1
    snap = alloc.snapshot()
    snap.device_traces = []  # the model's own history is not the program's
    notes += _what_if_notes(alloc, res, cfg, capacity, start_reserved, len(initial or []),
                            len(alloc_idx))
    if res.unknown_frees:
        notes.append(f"{res.unknown_frees} frees of blocks allocated before the trace began "
                     "were skipped")
    return ModelRun(cfg, capacity, snap, alloc.memory_stats(), list(res.ooms), steps,
                    res.unknown_frees, notes)


def _what_if_notes(alloc: CachingAllocator, res: ReplayResult, cfg: AllocatorConfig, capacity: int | None,
                   start_reserved: int, n_start: int, n_allocs: int) -> list[str]:
    """Where the what-if cannot mean what it seems: a card smaller than the memory the
    window starts with, or a window that never makes a segment (settings cannot act)."""
    notes: list[str] = []
    peak = alloc.stats.peak("reserved_bytes")
    if capacity is not None and start_reserved > capacity:
        notes.append(
            f"the window starts with {format_bytes(start_reserved)} reserved, above the "
            f"{format_bytes(capacity)} capacity: that memory was reserved before the recording "
            "began, so the model starts from it as it was (a card of that size would have run "
            "out of memory earlier); the simulated reserved figures can exceed the capacity, and "
            "only a new segment needed inside the window is refused (an OOM after the cached "
            "blocks are freed)")
    elif capacity is not None and peak > capacity:
        notes.append(f"the simulated peak reserved {format_bytes(peak)} is above the "
                     f"{format_bytes(capacity)} capacity")
    made = any(a in SEG_ADD for a, _addr, _size, _stream in alloc.trace)
    if n_start and n_allocs and not made and not res.ooms:
        what = ("expandable_segments applies only to segments made after the setting, "
                "so it changes nothing here; " if cfg.expandable_segments else "")
        notes.append(
            f"the window makes no new segment: every one of its {n_allocs:,} requests was "
            f"served from the {n_start:,} segments ({format_bytes(start_reserved)}) reserved "
            f"before it, so the what-if cannot change reserved memory; {what}record from "
            "before the memory is reserved (e.g. from the start of the program) to see what "
            "another setting or card would do")
    return notes


def real_figures(snapshot: Snapshot, trace: list[TraceEntry],
                 stats: Mapping[str, int] | None = None, *, peak_allocated: int | None = None,
                 end_allocated: int | None = None, cpu: bool = False) -> dict[str, int | None]:
    """The same comparison row for what really happened (stats when captured live).

    ``cpu``: the trace is the CPU allocator's, which caches nothing: only the
    allocated figures exist, as the timeline counts them (``end_allocated``,
    ``peak_allocated``: what was alive at the start included).
    """
    if stats:
        return dict(_stat_figures(stats))
    s = fragmentation.summarize(snapshot)
    if cpu:
        live = end_allocated if end_allocated is not None else sum(
            e.size for e in trace if e.action == "alloc") - sum(
            e.size for e in trace if e.action in ("free_completed", "free"))
        return {"reserved": None, "allocated": live, "peak_reserved": None,
                "peak_allocated": peak_allocated, "inactive_split": None, "ooms": 0,
                "retries": None}
    return {
        "reserved": s.reserved,
        "allocated": s.allocated,
        "peak_reserved": None,
        "peak_allocated": peak_allocated if s.reserved else None,
        "inactive_split": s.inactive_split,
        "ooms": sum(1 for e in trace if e.action == "oom"),
        "retries": None,
    }


COMPARE_ROWS = (
    ("reserved", "reserved at end", True),
    ("allocated", "allocated at end", True),
    ("peak_reserved", "peak reserved", True),
    ("peak_allocated", "peak allocated", True),
    ("inactive_split", "inactive_split", True),
    ("ooms", "OOMs", False),
    ("retries", "alloc retries", False),
)


def compare(real: dict[str, int | None], model: ModelRun) -> list[tuple[str, int | None, int, bool]]:
    """Rows (label, real, simulated, is_bytes) in a fixed order."""
    sim = model.figures()
    return [(label, real.get(key), sim[key], is_bytes) for key, label, is_bytes in COMPARE_ROWS]
