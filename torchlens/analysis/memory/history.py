"""Which device's part of a snapshot the analysis reads, and what its history lacks.

``torch.cuda.memory._snapshot()`` holds every device: segments carry a
``device`` key and ``device_traces[k]`` is device k's history, whatever device
was asked for. A capture knows its device: its figures come from exactly that
device or say it has none; another GPU's history is never shown in its place.
A file someone sent does not say which device they meant: the asked device
when it has data, else the device that has it, named in a note.

The history is a ring buffer of ``max_entries`` per device: a long cell loses
its oldest entries. Then the timeline cannot start from ``stats_before`` (that
was before the lost part): its base is worked back from ``stats_after``, and
the notes say how much was lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torchlens.model import GpumemPayload
from torchlens.model.snapshot import Snapshot, TraceEntry
from torchlens.model.units import format_bytes


@dataclass
class DeviceView:
    """One device's segments and history (``snapshot``: the other devices' left out)."""

    device: int
    snapshot: Snapshot
    trace: list[TraceEntry]
    notes: list[str] = field(default_factory=list)


def _devices_with(snap: Snapshot) -> tuple[list[int], list[int]]:
    with_trace = [i for i, t in enumerate(snap.device_traces) if t]
    with_segs = sorted({s.device for s in snap.segments})
    return with_trace, with_segs


def device_view(snap: Snapshot, device: int, *, known: bool) -> DeviceView:
    """Device ``device``'s part of ``snap``. ``known``: the capture recorded on that
    device, so an empty part stays empty (with a note); otherwise (a loaded file)
    the device that has data stands in, and a note names it."""
    with_trace, with_segs = _devices_with(snap)
    notes: list[str] = []
    chosen = device
    has_data = device in with_trace or device in with_segs
    others = sorted(set(with_trace + with_segs) - {device})
    if not has_data and others:
        names = ", ".join(f"cuda:{d}" for d in others)
        if known:
            notes.append(f"The allocator recorded nothing on cuda:{device}, the device this "
                         f"cell measured; it has data for {names}. Nothing of another GPU is "
                         f"shown here: measure that device with --device N.")
        else:
            chosen = (with_trace or with_segs)[0]
            notes.append(f"The file has no data for cuda:{device}; showing cuda:{chosen}, "
                         f"the first device it has data for (it has {names}).")
    elif others:
        names = ", ".join(f"cuda:{d}" for d in others)
        notes.append(f"Figures are cuda:{chosen}'s only; the snapshot also holds {names} "
                     "(the allocator records every device).")
    traces = snap.device_traces
    trace = traces[chosen] if chosen < len(traces) else []
    return DeviceView(chosen, snap.device_part(chosen), trace, notes)


def _stat(stats: Mapping[str, int | float], key: str) -> int | None:
    value = stats.get(key)
    return int(value) if isinstance(value, (int, float)) else None


def wrapped_base(p: GpumemPayload, trace_delta: int) -> int | None:
    """The allocated bytes at the first kept entry of a wrapped history: the end
    (``stats_after``) less what the kept entries changed; None without stats."""
    end = _stat(p.stats_after, "allocated_bytes.all.current")
    return None if end is None else end - trace_delta


def history_notes(p: GpumemPayload, *, unknown_frees: int, unknown_bytes: int,
                  start_from_stats: int | None, base: int | None) -> list[str]:
    """What the history lacks, in the user's words: a full ring buffer, frees of memory
    allocated before the history begins, a recording that was the user's."""
    notes = []
    if p.user_recording:
        notes.append("Allocator history was already on when the cell started (your own "
                     "_record_memory_history): torchlens left it on, with your settings, and "
                     "read the cell's entries from it.")
    if p.history_full:
        lost = ""
        if base is not None and start_from_stats is not None:
            lost = (f"; the cell's lost part changed allocated memory by "
                    f"{format_bytes(base - start_from_stats)} (from stats_before's "
                    f"{format_bytes(start_from_stats)} to {format_bytes(base)} where the kept "
                    "history begins)")
        notes.append(
            f"The allocator's history is a ring buffer of {p.recorded.max_entries:,} entries "
            f"and it was full ({p.history_entries:,}): the cell's oldest entries were dropped, "
            "so the timeline, its peak and the sites cover only the cell's last part. The "
            "timeline's base is worked back from stats_after"
            + (" (no stats: it is unknown)" if base is None else "") + lost
            + ". Run fewer iterations in the cell to see all of it.")
    elif unknown_frees and p.measured_on == "snapshot":
        notes.append(
            f"{unknown_frees:,} frees ({format_bytes(unknown_bytes)}) are of blocks allocated "
            "before the history begins: recording started after them, or the ring buffer "
            "dropped the oldest entries. The timeline's base is worked back from the "
            "snapshot's segments.")
    return notes


def stats_only_notes(p: GpumemPayload) -> list[str]:
    """What a capture without history (cudaMallocAsync) can still say, from memory_stats."""
    before, after = p.stats_before, p.stats_after
    notes = [p.history_error] if p.history_error else []
    peak_b = _stat(before, "allocated_bytes.all.peak")
    peak_a = _stat(after, "allocated_bytes.all.peak")
    if peak_a is not None and peak_b is not None:
        notes.append(
            f"Peak allocated {format_bytes(peak_a)} is memory_stats' peak, reached in this cell."
            if peak_a > peak_b else
            f"The cell did not raise memory_stats' peak ({format_bytes(peak_a)}, reached "
            "before it); the cell's own peak is at most that, and unknown without history.")
    return notes


def stats_peak(p: GpumemPayload) -> int | None:
    """The cell's peak when memory_stats shows it rose inside the cell, else None."""
    b = _stat(p.stats_before, "allocated_bytes.all.peak")
    a = _stat(p.stats_after, "allocated_bytes.all.peak")
    return a if a is not None and b is not None and a > b else None
