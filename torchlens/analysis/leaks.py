"""Possible leaks: memory allocated in the cell and still alive at its end.

Everything alive at the end is listed, grouped by site, because that is what
the cell left behind. A site is *flagged* when what it left behind comes from
two or more separate passes over it (a pass is a run of consecutive
allocations from that site): a training loop that keeps each step's loss with
its graph leaves activations behind on every pass, while one that does not
leaves at most the last step's. A model built in one line is one pass, so its
parameters are listed but not flagged. ``--repeat N`` gives the direct test:
allocated bytes at the end of each run, and the growth per run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .memory_timeline import MemoryTimeline, live_bytes_at


@dataclass
class LeakRow:
    """Bytes from one site still allocated at the end of the cell."""

    site: str
    function: str
    bytes: int
    count: int
    passes: int  # separate passes over the site that left memory behind
    flagged: bool
    example: list[dict[str, Any]]


def survivors(tl: MemoryTimeline) -> list[LeakRow]:
    """Every site with allocations still alive at the end, largest first."""
    pass_no: dict[str, int] = {}
    prev = None
    rows: dict[str, LeakRow] = {}
    seen_pass: dict[str, set[int]] = {}
    for a in tl.allocations:
        if a.site != prev:
            pass_no[a.site] = pass_no.get(a.site, 0) + 1
            prev = a.site
        if a.t_free is not None:
            continue
        r = rows.get(a.site)
        if r is None:
            r = rows[a.site] = LeakRow(a.site, a.function, 0, 0, 0, False, a.frames)
            seen_pass[a.site] = set()
        r.bytes += a.size
        r.count += 1
        seen_pass[a.site].add(pass_no[a.site])
    for site, r in rows.items():
        r.passes = len(seen_pass[site])
        r.flagged = r.passes >= 2
    return sorted(rows.values(), key=lambda r: (not r.flagged, -r.bytes, r.site))


def possible_leaks(tl: MemoryTimeline) -> list[LeakRow]:
    """The flagged sites only."""
    return [r for r in survivors(tl) if r.flagged]


@dataclass
class RunGrowth:
    """Allocated bytes at the end of one ``--repeat`` run and the change over it."""

    run: int
    end_allocated: int
    growth: int


def growth_per_run(tl: MemoryTimeline, runs: list[tuple[int, int]]) -> list[RunGrowth]:
    """One row per run (``runs`` are (start_us, end_us) on the trace's clock)."""
    out = []
    prev = tl.start_allocated
    for i, (_start, end) in enumerate(runs, 1):
        value = live_bytes_at(tl, end)
        out.append(RunGrowth(i, value, value - prev))
        prev = value
    return out


def steady_growth(rows: list[RunGrowth]) -> int | None:
    """Typical growth per run after the first (which includes warm-up such as
    optimizer state); None with fewer than two runs."""
    later = sorted(r.growth for r in rows[1:])
    if not later:
        return None
    return later[len(later) // 2]
