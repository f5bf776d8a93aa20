"""Possible leaks: memory allocated in the cell and still alive at its end.

Everything alive at the end is listed, grouped by site, because that is what
the cell left behind. A site is *flagged* when what it left behind comes from
two or more separate passes over it (a pass is a run of consecutive
allocations from that site): a training loop that keeps each step's loss with
its graph leaves activations behind on every pass, while one that does not
leaves at most the last step's. A model built in one line is one pass, so its
parameters are listed but not flagged. ``--repeat N`` gives the direct test:
allocated bytes at the end of each run, and the growth per run.

A loaded snapshot's window is not a cell: it may hold a whole training step,
where the optimizer makes its state once, one parameter after another (many
passes over the same lines), and keeps it. There (``repeated_only``) a pass
counts only if memory from its site was freed since the site's previous pass
began: the site frees and reallocates, as a loop's step does, and still leaves
memory behind. A site can do that and still only make memory once per parameter:
a backward pass makes each parameter's gradient, and a foreach optimizer each
parameter's state, one layer after another, freeing its temporaries in between.
So a snapshot's survivors that pair one for one, by block size, with blocks alive
before the window began (the parameters, which the window did not allocate) are
memory made once per parameter: they are listed, and their passes do not count.
Blocks of the smallest size (512 bytes: a scalar such as a loss kept every step)
are never paired, since any small buffer would pair with them.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass

from torchlens.analysis.memory.timeline import MemoryTimeline, live_bytes_at
from torchlens.model.snapshot import Frame, Snapshot


@dataclass
class LeakRow:
    """Bytes from one site still allocated at the end of the cell."""

    site: str
    function: str
    bytes: int
    count: int
    passes: int  # separate passes over the site that left memory behind (that count)
    flagged: bool
    example: list[Frame]
    #: tensors paired with a parameter (a block alive before the window of the same size)
    per_parameter: int = 0


FLAG_RULE = {
    False: "memory left behind on two or more passes over the same line.",
    True: ("memory left behind on two or more passes over the same line, each after memory "
           "from that line was freed (the line repeats, as a loop's step does). Memory made "
           "once and kept, such as optimizer state, and memory made once per parameter (a "
           "tensor of the size of one alive before the window, such as a gradient) is "
           "listed but not flagged."),
}


def _turned_over(tl: MemoryTimeline) -> dict[str, set[int]]:
    """Per site, the passes (numbered as in ``survivors``) that began after memory from
    the site was freed since its previous pass began."""
    starts: dict[str, list[int]] = {}
    frees: dict[str, list[int]] = {}
    prev = None
    for a in tl.allocations:
        if a.site != prev:
            starts.setdefault(a.site, []).append(a.index)
            prev = a.site
        if a.i_free is not None:
            frees.setdefault(a.site, []).append(a.i_free)
    out: dict[str, set[int]] = {}
    for site, st in starts.items():
        fs = sorted(frees.get(site, []))
        out[site] = {k + 1 for k in range(1, len(st))
                     if bisect.bisect_left(fs, st[k - 1]) < bisect.bisect_left(fs, st[k])}
    return out


#: the allocator's smallest block: a scalar (a kept loss) as much as a tiny parameter
SMALLEST_BLOCK = 512


def from_before(snapshot: Snapshot | None, tl: MemoryTimeline) -> Counter[int]:
    """Sizes of the blocks alive at the end of the window that it did not allocate
    (alive before it began: parameters, buffers), larger than ``SMALLEST_BLOCK``."""
    made = {a.addr for a in tl.allocations if a.t_free is None}
    return Counter(b.size for seg in (snapshot.segments if snapshot else [])
                   for b in seg.blocks
                   if b.state == "active_allocated" and b.address not in made
                   and b.size > SMALLEST_BLOCK)


def survivors(tl: MemoryTimeline, *, repeated_only: bool = False,
              before: Counter[int] | None = None) -> list[LeakRow]:
    """Every site with allocations still alive at the end, largest first.

    ``repeated_only``: count only passes that follow a free of the site's memory
    (a loaded snapshot, see the module docstring). ``before``: ``from_before`` of
    the snapshot; a site's survivors that pair with these by size are memory made
    once per parameter, and their passes do not count.
    """
    pass_no: dict[str, int] = {}
    prev = None
    rows: dict[str, LeakRow] = {}
    seen_pass: dict[str, set[int]] = {}
    pairs: dict[str, Counter[int]] = {}
    counted = _turned_over(tl) if repeated_only else None
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
        if before:  # each site pairs with each block once: gradient and state lines alike
            left = pairs.setdefault(a.site, before.copy())
            if left[a.size] > 0:
                left[a.size] -= 1
                r.per_parameter += 1
                continue
        if counted is None or pass_no[a.site] in counted[a.site]:
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
