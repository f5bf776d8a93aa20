"""The figures of a memory diff (``torchlens diff A.pickle B.pickle``) and of a folder
of per-rank snapshots, as typed structs.

``analysis.memory.diff`` and ``analysis.memory.ranks`` make them, the memdiff and
memranks payloads keep them, the views read them; ``msgspec.to_builtins`` gives the
JSON a saved result and ``--json`` hold, key by key as before, and
``memory_diff_from`` / ``memory_ranks_from`` read that JSON back (a file saved by an
older torchlens, whose verdict was a plain sentence, included).

Pure data: this module imports nothing of torchlens beyond ``model.findings``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from torchlens.model.findings import INFO, Finding, as_finding

#: A memory diff's verdict's code.
MEMORY_DIFF = "memory_diff"
#: A folder of per-rank snapshots' verdict's code (the imbalance).
MEMORY_RANKS = "memory_ranks"


class Series(msgspec.Struct):
    """Allocated bytes over a window, decimated: ``x`` in the chart's units (ms since
    the first event, or the window's share in %), the start first."""

    x: list[float]
    allocated: list[int]


# ---------------------------------------------------------------- the memory diff


class DiffThresholds(msgspec.Struct):
    """Within ``same_pct`` % of A's bytes is the same; beyond it but within
    ``small_bytes`` (``small_share`` of the larger peak) small."""

    same_pct: float
    small_share: float
    small_bytes: int


class FigureChange(msgspec.Struct):
    """One figure of A and B (bytes), ``delta`` = b - a, ``pct`` = 100 * delta / a
    (None when a is 0)."""

    a: int
    b: int
    delta: int
    pct: float | None


class DiffFigures(msgspec.Struct):
    """Peak, start and end allocated of each side."""

    peak: FigureChange
    start: FigureChange
    end: FigureChange


class ChangeRow(msgspec.Struct):
    """One category or site alive at either side's peak: its bytes at each, the change
    and its ``status`` (added, removed, grew, shrank, small, same)."""

    name: str
    status: str
    a_bytes: int
    b_bytes: int
    delta: int
    delta_pct: float | None
    categories: str
    function: str


class MadeBy(msgspec.Struct):
    """The allocation that made a side's peak: its bytes, site and category."""

    bytes: int
    site: str
    category: str


class DiffSide(msgspec.Struct):
    """What one side is: where it was measured, its clock, whether its peak's
    contents are known, how many trace events, what made its peak, what is missing."""

    label: str
    measured_on: str
    clock: str
    peak_known: bool
    events: int
    made_by: MadeBy | None
    missing: list[str]


class DiffSides(msgspec.Struct):
    a: DiffSide
    b: DiffSide


class DiffTimelines(msgspec.Struct):
    """Each side's allocated bytes over one shared x axis (None: no events)."""

    x_label: str
    a: Series | None
    b: Series | None


class MemoryDiff(msgspec.Struct, kw_only=True):
    """Memory result B against A (``analysis.memory.diff.diff_memory``) and its
    verdict (a ``Finding``, code ``memory_diff``)."""

    thresholds: DiffThresholds
    figures: DiffFigures
    categories: list[ChangeRow]
    sites: list[ChangeRow]
    #: who named the categories, "" in a file saved before it was kept
    category_from: str = ""
    category_note: str = ""
    #: status -> how many categories have it
    summary: dict[str, int]
    sides: DiffSides
    timelines: DiffTimelines
    notes: list[str]
    verdict: Finding = msgspec.field(default_factory=lambda: Finding(INFO, "",
                                                                     code=MEMORY_DIFF))


def memory_diff_from(data: dict[str, Any]) -> MemoryDiff:
    """A saved diff (``msgspec.to_builtins``' JSON) as a ``MemoryDiff``; a verdict saved
    as a plain sentence reads as an info finding."""
    verdict = as_finding(data.get("verdict"), INFO, MEMORY_DIFF) or Finding(
        INFO, "", code=MEMORY_DIFF)
    return msgspec.convert({**data, "verdict": verdict}, MemoryDiff, from_attributes=True)


# ------------------------------------------------------------- per-rank snapshots


class RankThresholds(msgspec.Struct):
    """A rank stands out above ``same_pct`` % of what it is set against and above
    ``small_share`` of its peak."""

    same_pct: float
    small_share: float


class Top(msgspec.Struct):
    """The category or site holding the most bytes at a rank's peak."""

    name: str
    bytes: int


class Excess(msgspec.Struct):
    """The group a rank holds most more of than the median other rank: its bytes and
    how many more (``extra``)."""

    name: str
    bytes: int
    extra: int


class RankPeak(msgspec.Struct):
    """One rank's peak: when (``x`` in µs since its first event, or ``entry`` in its
    trace), what held most of it, its end, and ``above``: the peak less what it is
    set against (the median, or with two ranks the other rank; None in a result saved
    before it was kept)."""

    rank: int
    source: str
    peak: int
    x: int | float | None
    clock: str
    entry: int | None
    top_category: Top | None
    top_site: Top | None
    end: int
    events: int
    missing: list[str]
    above: int | float | None = None


class Imbalance(msgspec.Struct):
    """The rank with the highest peak: how far above the median (and above what it is
    set against), the other rank of two (``reference``), and what makes the difference."""

    rank: int
    peak: int
    above_median: int
    above: int | None = None
    reference: int | None = None
    category: Excess | None = None
    site: Excess | None = None


class RankTimelines(msgspec.Struct):
    """Every drawn rank's allocated bytes on one x axis (rank as text -> series; None
    for a rank without events); ``left_out``: ranks with lower peaks not drawn."""

    x_label: str
    series: dict[str, Series | None]
    left_out: int


class MemoryRanks(msgspec.Struct):
    """A folder of per-rank snapshots side by side (``analysis.memory.ranks``) and its
    verdict (a ``Finding``, code ``memory_ranks``)."""

    thresholds: RankThresholds
    ranks: list[RankPeak]
    median_peak: float
    notes: list[str]
    compared_with: str = "median"
    imbalance: Imbalance | None = None
    timelines: RankTimelines = msgspec.field(
        default_factory=lambda: RankTimelines("", {}, 0))
    verdict: Finding = msgspec.field(default_factory=lambda: Finding(INFO, "",
                                                                     code=MEMORY_RANKS))


def memory_ranks_from(data: dict[str, Any]) -> MemoryRanks:
    """A saved per-rank analysis as a ``MemoryRanks`` (see ``memory_diff_from``)."""
    verdict = as_finding(data.get("verdict"), INFO, MEMORY_RANKS) or Finding(
        INFO, "", code=MEMORY_RANKS)
    return msgspec.convert({**data, "verdict": verdict}, MemoryRanks, from_attributes=True)
