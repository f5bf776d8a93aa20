"""What was alive at the peak of allocated memory, by category and by site.

The peak is the timeline's own (``MemoryTimeline.peak_allocated``: the same
replay, the same block rounding), at its first moment. What was alive then:

- the window's allocations made at or before that trace entry and not yet
  freed (allocated falls at ``free_requested``, as on the timeline);
- memory alive before the window began: blocks the trace frees later (their
  free entry has a size and a stack) and blocks still allocated at the end
  that the trace never touches (the segments name them, with their stack when
  recorded: Mosaic's "static" memory);
- whatever else the window's starting figure holds that neither names
  (``unattributed``; e.g. a history that wrapped), so the rows always add up
  to the peak exactly.

The allocation that made the peak is the trace entry the peak is at; a peak at
the window's start has none. ``missing`` says which answers a snapshot could
not give and why (no history, a wrapped one, no stacks).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from torchlens.analysis.frames import SiteMemo
from torchlens.analysis.memory import categories as cat
from torchlens.analysis.memory import stages
from torchlens.analysis.memory.timeline import MemoryTimeline
from torchlens.formats.locations import CellNames
from torchlens.model.snapshot import (
    TRACE_ACTIONS,
    Frame,
    SnapBlock,
    Snapshot,
    TraceEntry,
)
from torchlens.model.units import format_bytes

#: where a block alive at the peak comes from
IN_WINDOW, FREED_LATER, KEPT = "allocated in the window", "alive before, freed later", \
    "alive before and at the end"
#: a block alive before the window with no stack (often what the model was built with)
BEFORE_NO_STACK = "alive before the window (no stack)"
#: memory alive before the window that no block names
UNATTRIBUTED = "alive before the window (unattributed)"
#: the dtype row of blocks torch's memory profiler saw no tensor for (no op read it)
DTYPE_NOT_SEEN = "dtype not seen (no recorded op read the tensor)"


@dataclass
class PeakBlock:
    """One block alive at the peak (``size``: the bytes the timeline counts)."""

    size: int
    category: str
    site: str
    function: str
    frames: list[Frame]
    origin: str
    index: int | None = None  # its alloc's trace entry (None: allocated before the window)
    stage: str = ""  # the innermost record_function range open at its allocation
    source: str = cat.FROM_RULES  # who named its category: torch, your regexes, the rules
    dtype: str = ""  # its tensor's dtype as torch's memory profiler saw it ("": not seen)

    @property
    def category_text(self) -> str:
        """Its category, and that torch's memory profiler named it when it did: torch calls
        Adam's scratch tensors "parameter" and "activation", which next to an opt.step()
        line would read as torchlens contradicting itself."""
        if self.source == cat.FROM_TORCH:
            return f"{self.category}, named by torch's memory profiler"
        return self.category


@dataclass
class GroupRow:
    """Bytes alive at the peak of one category or one site."""

    name: str
    bytes: int
    count: int
    share: float  # of the peak
    function: str = ""
    frames: list[Frame] = field(default_factory=list)  # the largest block's stack
    categories: str = ""  # a site's categories, largest first
    source: str = ""  # where the group's blocks' categories came from (``source_label``)


@dataclass
class PeakAnalysis:
    """The peak and what it was made of."""

    peak: int
    entry: int | None  # trace entry of the event the peak is at; None: the start / unknown
    x: int | None  # that event on the timeline's x axis (``t_us`` units)
    trigger: PeakBlock | None  # the allocation that made the peak
    blocks: list[PeakBlock]
    unattributed: int  # bytes alive at the peak that no block names (may be negative)
    by_category: list[GroupRow]
    by_site: list[GroupRow]
    missing: list[str] = field(default_factory=list)
    rules: list[tuple[str, str]] = field(default_factory=list)  # (category, why)
    #: by the record_function range each block was allocated in; [] when none recorded
    by_stage: list[GroupRow] = field(default_factory=list)
    #: where the categories came from, in a few words and as the sentence views show
    category_from: str = "inferred from stacks"
    category_note: str = cat.INFERRED
    #: why the peak has no moment, in the words of its "when" (no history, nothing allocated)
    moment: str = ""
    #: trace entry of every alloc, free and free of a block from before the window ->
    #: the block's category (the stacked timeline, ``timeline_categories``)
    entry_categories: dict[int, str] = field(default_factory=dict)
    #: by dtype, where torch's memory profiler saw the tensors' (``categories="torch"``:
    #: the allocator history records bytes, not dtypes); [] when it saw none
    by_dtype: list[GroupRow] = field(default_factory=list)

    @property
    def known(self) -> bool:
        """Whether the blocks alive at the peak could be told at all."""
        return self.entry is not None or bool(self.blocks)

    def document(self) -> PeakDocument:
        """The peak as the JSON document holds it (bytes as integers; ``categories_from``
        says who named the categories, each category row's ``source`` the same for its
        blocks)."""
        def rows(groups: list[GroupRow]) -> list[GroupDocument]:
            return [GroupDocument(r.name, r.bytes, r.count, r.share, r.function,
                                  r.categories, r.source) for r in groups]

        t = self.trigger
        return PeakDocument(
            self.peak, self.entry, self.x,
            None if t is None else PeakMadeBy(t.size, t.site, t.function, t.category,
                                              t.source),
            self.category_from == "inferred from stacks", self.category_from,
            rows(self.by_category), rows(self.by_site), rows(self.by_stage),
            self.unattributed, list(self.missing))


class GroupDocument(msgspec.Struct):
    """One category, site or stage alive at the peak, as the JSON document holds it."""

    name: str
    bytes: int
    blocks: int
    share: float
    function: str
    categories: str
    source: str


class PeakMadeBy(msgspec.Struct):
    """The allocation the peak is at: its bytes, site, function and category (and who
    named that category)."""

    bytes: int
    site: str
    function: str
    category: str
    source: str


class PeakDocument(msgspec.Struct):
    """``PeakAnalysis`` as plain figures (the memory document's ``peak``)."""

    peak_allocated: int
    trace_entry: int | None
    x: int | None
    made_by: PeakMadeBy | None
    categories_inferred: bool
    categories_from: str
    by_category: list[GroupDocument]
    by_site: list[GroupDocument]
    by_stage: list[GroupDocument]
    unattributed_bytes: int
    missing: list[str]


def _group(blocks: list[PeakBlock], peak: int, key: Callable[[PeakBlock], str],
           extra: int = 0, extra_name: str = "") -> list[GroupRow]:
    rows: dict[str, GroupRow] = {}
    biggest: dict[str, int] = {}
    cats: dict[str, dict[str, int]] = {}
    sources: dict[str, set[str]] = {}
    for b in blocks:
        k = key(b)
        r = rows.get(k)
        if r is None:
            r = rows[k] = GroupRow(k, 0, 0, 0.0, b.function)
        r.bytes += b.size
        r.count += 1
        if b.size > biggest.get(k, -1):
            biggest[k], r.frames, r.function = b.size, b.frames, b.function
        c = cats.setdefault(k, {})
        c[b.category] = c.get(b.category, 0) + b.size
        sources.setdefault(k, set()).add(b.source)
    if extra:
        rows[extra_name] = GroupRow(extra_name, extra, 0, 0.0)
    for k, r in rows.items():
        r.share = r.bytes / peak if peak else 0.0
        r.categories = ", ".join(n for n, _ in sorted(cats.get(k, {}).items(),
                                                      key=lambda x: -x[1]))
        r.source = cat.source_label(sources[k]) if k in sources else ""
    return sorted(rows.values(), key=lambda r: (-r.bytes, r.name))


def _peak_point(tl: MemoryTimeline) -> int | None:
    """The first point of the timeline at the peak; None: the peak is the start."""
    peak = tl.peak_allocated
    for j, v in enumerate(tl.allocated):
        if v == peak:
            return j
    return None


def _kept_blocks(snapshot: Snapshot, touched: set[int]) -> list[SnapBlock]:
    """Blocks allocated at the end that no trace entry allocates or frees."""
    return [b for s in snapshot.segments for b in s.blocks
            if b.state == "active_allocated" and b.address not in touched]


def _kept_within(kept: list[SnapBlock], room: int) -> tuple[list[SnapBlock], list[str]]:
    """The segments' blocks the history never touches, when they fit in what the window's
    start leaves at the peak (``room``); else none, and why. More means the segments and
    the history disagree (segments not recorded with this history, addresses that differ):
    such blocks cannot all have been alive before the window, so none is named."""
    total = sum(b.size for b in kept)
    if total <= max(room, 0):
        return kept, []
    return [], [f"The segments hold {format_bytes(total)} in {len(kept):,} blocks the history "
                f"never allocates or frees, more than the {format_bytes(max(room, 0))} the "
                "window's start leaves at the peak: segments and history disagree (not "
                "recorded together), so those blocks are not counted at the peak."]


def _before(frames: list[Frame], categorize: cat.Categorizer) -> str:
    """A block alive before the window: its category, or that it has no stack."""
    return categorize(frames) if frames else BEFORE_NO_STACK


def _source(category: str, custom: list[tuple[str, re.Pattern[str]]] | None) -> str:
    return cat.FROM_USER if any(category == n for n, _ in custom or ()) else cat.FROM_RULES


def _name_sources(out: PeakAnalysis, custom: list[tuple[str, re.Pattern[str]]] | None,
                  torch_error: str) -> None:
    """Say where the peak's categories came from (label, sentence, hovers, and why torch's
    memory profiler, when asked, gave none)."""
    used = {b.source for b in out.blocks}
    out.category_from = cat.source_label(used)
    if cat.FROM_TORCH in used:
        out.category_note = cat.FROM_TORCH_NOTE + (
            " Blocks it did not name are inferred from their stack (torchlens rules)."
            if cat.FROM_RULES in used else "")
        # the hover of a category row: torch's word, and the rule where some blocks of
        # that category were inferred (later entries win in the views' dict)
        rule = dict(out.rules)
        mixed = {b.category for b in out.blocks if b.source != cat.FROM_TORCH}
        for name in dict.fromkeys(b.category for b in out.blocks if b.source == cat.FROM_TORCH):
            why = "named by torch's memory profiler"
            if name in mixed and name in rule:
                why += f"; the blocks it did not track: {rule[name]}"
            out.rules.append((name, why))
    if torch_error:
        out.missing.append(f"Categories were asked of torch's memory profiler (--categories "
                           f"torch), but {torch_error}: they are inferred from stacks.")


def _missing(trace: list[TraceEntry], blocks: list[PeakBlock], peak: int,
             unattributed: int, wrapped: bool) -> list[str]:
    out = []
    if wrapped:
        out.append("The history wrapped (its oldest entries were lost): the peak is the kept "
                   "part's, and memory allocated before it is counted but its blocks not named.")
    if unattributed:
        out.append(f"{format_bytes(unattributed)} of the peak was alive before the window "
                   "and neither freed in it nor found in the segments: its category and "
                   "site are missing (unattributed).")
    bare = sum(b.size for b in blocks if not b.frames)
    if bare:
        out.append(f"{format_bytes(bare)} of the {format_bytes(peak)} at the peak has no stack "
                   "(frames not recorded: record with stacks, e.g. "
                   "torch.cuda.memory._record_memory_history(stacks='all')): its category and "
                   "site are unknown.")
    odd = sorted({e.action for e in trace} - set(TRACE_ACTIONS) - {"free"})
    if odd:
        out.append(f"Trace entries with actions torchlens does not know were skipped "
                   f"({', '.join(odd[:5])}): the peak counts only the known ones.")
    return out


#: why a peak has no moment, blocks or trigger (``no_history``'s ``why``)
SEGMENTS_ONLY, STATS_ONLY, NOTHING = "segments only", "stats only", "nothing allocated"
_RECORD = ("Record it with torch.cuda.memory._record_memory_history() before the work, "
           "or use %%gpumem.")


def no_history(peak: int, why: str = SEGMENTS_ONLY) -> PeakAnalysis:
    """A peak with no history to tell what made it: a snapshot with segments only
    (``peak`` is what they hold), a capture whose allocator records none (memory_stats'
    figures), or a window that allocated nothing; ``missing`` says which."""
    if why == NOTHING:
        return PeakAnalysis(peak, None, None, None, [], 0, [], [], moment="at the start "
                            "(nothing was allocated or freed)", missing=[
                                "Nothing was allocated or freed in the window: the peak is "
                                "what was alive at its start, and no block names it."])
    if why == STATS_ONLY:
        return PeakAnalysis(peak, None, None, None, [], 0, [], [], moment="moment not known "
                            "(no allocation history)", missing=[
                                "No allocation history (the allocator records none: "
                                "cudaMallocAsync): the figure is memory_stats'; the moment of "
                                "the peak, what was alive then and the allocation that made "
                                "it are missing."])
    return PeakAnalysis(peak, None, None, None, [], 0, [], [], moment="moment not known "
                        "(no allocation history)", missing=[
                            f"No allocation history (segments only): {format_bytes(peak)} is "
                            "what the segments held allocated when the snapshot was taken, so "
                            "the peak was at least that; its moment, what was alive then and "
                            "the allocation that made it are missing. " + _RECORD])


def analyze_peak(tl: MemoryTimeline, trace: list[TraceEntry], snapshot: Snapshot,
                 *, block_size: Callable[[int], int] | None = None,
                 cells: CellNames | None = None,
                 custom: list[tuple[str, re.Pattern[str]]] | None = None,
                 wrapped: bool = False, device: int = 0, torch_error: str = "") -> PeakAnalysis:
    """The peak of ``tl`` (built from ``trace`` with ``block_size``) and what made it;
    by stage from the snapshot's ``external_annotations`` of ``device``. An allocation
    torch's memory profiler named (``torch_category``) has torch's category at the peak,
    unless one of the user's ``custom`` categories matched it; ``torch_error``: why
    torch's memory profiler, asked, named none."""
    counted = block_size or (lambda n: n)
    peak = tl.peak_allocated
    if not trace:
        return no_history(peak)
    j = _peak_point(tl)
    entry = tl.index[j] if j is not None else -1  # -1: before the first entry
    known_peak_only = tl.known_peak is not None and peak > max(
        tl.start_allocated, max(tl.allocated, default=0))
    categorize, site_of = cat.Categorizer(custom), SiteMemo(cells)
    raw = [(a.index, a.i_free, categorize(a.frames)) for a in tl.allocations]
    kinds = cat.by_lifetime(raw)
    entry_categories: dict[int, str] = {}
    t_last = trace[-1].time_us or 0
    for a, (_i, _f, c) in zip(tl.allocations, raw, strict=True):
        # The stack draws a block in one category for its whole life (its alloc and free
        # are the only events that move it). Torch names each tensor version; a block torch
        # named is drawn in the one it held longest, so the area drawn in each colour is
        # mostly right; the category at the allocation alone would paint a buffer torch
        # renamed after one op in the wrong colour for all its life. A block alive at the
        # peak is drawn as the peak table names it (below), so the two agree exactly.
        theirs = None if _source(c, custom) == cat.FROM_USER else cat.torch_category_longest(
            trace[a.index], (trace[a.i_free].time_us or 0) if a.i_free is not None
            else t_last)
        entry_categories[a.index] = theirs or kinds.get(a.index, c)
        if a.i_free is not None:
            entry_categories[a.i_free] = entry_categories[a.index]
    blocks = []
    t_peak = (trace[entry].time_us or 0) if entry >= 0 else 0
    for a, (_i, _f, c) in zip(tl.allocations, raw, strict=True):
        if a.index > entry:
            break
        if a.i_free is None or a.i_free > entry:
            kind, source = kinds.get(a.index, c), _source(c, custom)
            theirs = None if source == cat.FROM_USER else cat.torch_category_at(
                trace[a.index], t_peak)
            if theirs is not None:
                kind, source = theirs, cat.FROM_TORCH
                # the stacked timeline draws the block as the peak names it
                entry_categories[a.index] = kind
                if a.i_free is not None:
                    entry_categories[a.i_free] = kind
            blocks.append(PeakBlock(counted(a.size), kind, a.site, a.function,
                                    a.frames, IN_WINDOW, a.index, source=source,
                                    dtype=trace[a.index].torch_dtype or ""))
    before = tl.start_allocated
    for i in tl.unknown_free_index:
        e = trace[i]
        frames = e.frames
        entry_categories[i] = _before(frames, categorize)
        if i <= entry:
            before -= counted(e.size)
            continue
        site, fn = site_of(frames)
        c = entry_categories[i]
        blocks.append(PeakBlock(counted(e.size), c, site, fn, frames, FREED_LATER,
                                source=_source(c, custom)))
    touched = {e.addr for e in trace if e.action in
               ("alloc", "free_requested", "free_completed", "free")}
    kept, disagree = _kept_within(_kept_blocks(snapshot, touched),
                                  peak - sum(b.size for b in blocks))
    for b in kept:
        frames = b.frames
        site, fn = site_of(frames)
        c = _before(frames, categorize)
        blocks.append(PeakBlock(b.size, c, site, fn, frames, KEPT,
                                source=_source(c, custom)))
    # never a negative row: blocks naming more than the peak are said in ``missing``
    over = sum(b.size for b in blocks) - peak
    unattributed = max(0, -over)
    if over > 0:
        disagree.append(f"The blocks alive at the peak add to {format_bytes(over)} more than "
                        "the peak: the window's starting figure is lower than the history "
                        "shows was alive then, so shares add to more than 100%.")
    trigger = next((b for b in blocks if b.index == entry), None)
    rules = [(name, rx.pattern) for name, rx in custom or ()]
    rules += [(c, why) for c, _t, why in cat.RULES]
    out = PeakAnalysis(peak, entry if j is not None else None, tl.t_us[j] if j is not None
                       else 0, trigger, blocks, unattributed,
                       _group(blocks, peak, lambda b: b.category, unattributed,
                              UNATTRIBUTED),
                       _group(blocks, peak, lambda b: b.site, unattributed,
                              UNATTRIBUTED),
                       missing=disagree + _missing(trace, blocks, peak, unattributed,
                                                   wrapped),
                       rules=rules, entry_categories=entry_categories,
                       by_dtype=_group(blocks, peak, lambda b: b.dtype or DTYPE_NOT_SEEN,
                                       unattributed, UNATTRIBUTED)
                       if any(b.dtype for b in blocks) else [])
    assert out.unattributed >= 0 and all(r.bytes >= 0 for r in out.by_category), \
        "a row alive at the peak is never negative"
    _name_sources(out, custom, torch_error)
    ranges, skipped = stages.stage_ranges(snapshot.external_annotations, device)
    why_not = stages.missing_line(ranges, skipped, tl.clock == "us")
    if why_not:
        out.missing.append(why_not)
    if ranges and tl.clock == "us":
        fresh = [b for b in blocks if b.origin == IN_WINDOW]
        at = stages.stages_at([trace[b.index].time_us or 0  # type: ignore[index]
                               for b in fresh], ranges)
        for b, name in zip(fresh, at, strict=True):
            b.stage = name
        for b in blocks:
            b.stage = b.stage or stages.BEFORE
        out.by_stage = _group(blocks, peak, lambda b: b.stage, unattributed,
                              UNATTRIBUTED)
    if known_peak_only:
        out.missing.insert(0, f"The peak {format_bytes(peak)} comes from memory_stats, not "
                              "from the history: what was alive then is missing.")
        out.blocks, out.by_category, out.by_site, out.trigger = [], [], [], None
        out.by_stage = []
    return out
