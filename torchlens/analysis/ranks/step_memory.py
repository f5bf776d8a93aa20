"""A profiled step's memory, as a rank's summary sends it (docs/RANK_PROFILE.md).

On CUDA, the allocator's own counters; on a CPU run, the profiler's CPU
``[memory]`` events replayed through the caching-allocator model: ``allocated``
counts the blocks a CUDA caching allocator would hand out (requests rounded up
to 512 B), as ``allocated_bytes`` does, not the bytes the program asked for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from torchlens.analysis.memory.allocator import OOM, CachingAllocator
from torchlens.analysis.trace.events import name_mask
from torchlens.model import Trace
from torchlens.model.records import SummaryMemory


def step_memory(trace: Trace, host_start: float, host_end: float,
                cuda_memory: Mapping[str, int | None] | None) -> SummaryMemory | None:
    """The allocator's own counters, or the CPU ``[memory]`` events replayed through
    the caching-allocator model up to the step's end (peak within the step)."""
    if cuda_memory is not None:
        return SummaryMemory(allocated=_int(cuda_memory.get("allocated")),
                             reserved=_int(cuda_memory.get("reserved")),
                             inactive_split=_int(cuda_memory.get("inactive_split")),
                             largest_free=_int(cuda_memory.get("largest_free")),
                             peak_allocated=_int(cuda_memory.get("peak_allocated")),
                             source="cuda")
    ev = trace.events
    rows = np.flatnonzero(name_mask(trace, re.compile(r"^\[memory\]$"))
                          & (ev["device_type"] == 0) & (ev["mem_bytes"] != 0))
    if len(rows) == 0:
        return None
    rows = rows[np.argsort(ev["ts"][rows], kind="stable")]
    rows = rows[ev["ts"][rows] < host_end]
    before = int(np.searchsorted(ev["ts"][rows], host_start, side="left"))
    model = CachingAllocator(record_history=False)
    live: dict[int, Any] = {}
    addrs, sizes = ev["addr"][rows].tolist(), ev["mem_bytes"][rows].tolist()
    for i, (addr, size) in enumerate(zip(addrs, sizes, strict=True)):
        if i == before:
            model.stats.reset_peaks()
        if size > 0:
            old = live.pop(addr, None)
            if old is not None:  # a free the trace missed: the address is reused
                model.free(old)
            block = model.malloc(size)
            if not isinstance(block, OOM):  # an OOM leaves nothing to free later
                live[addr] = block
        else:
            block = live.pop(addr, None)
            if block is not None:  # else allocated before the trace began
                model.free(block)
    if before >= len(rows):
        model.stats.reset_peaks()
    stats = model.stats
    return SummaryMemory(allocated=int(stats.current("allocated_bytes")),
                         reserved=int(stats.current("reserved_bytes")),
                         inactive_split=int(stats.current("inactive_split_bytes")),
                         largest_free=int(max(model.small.largest_free(),
                                              model.large.largest_free())),
                         peak_allocated=int(stats.peak("allocated_bytes")),
                         source="modelled")



def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
