"""Everything a ``gpumem`` report shows, computed once from a Profile (pure, no torch).

The render layer and the result object both read a ``MemoryAnalysis``, so the
HTML, the text fallback and ``result.leaks()`` can never disagree. Where the
figures come from is decided here and recorded in ``reserved_source``: a real
snapshot (CUDA capture or a loaded file) or the allocator model (a CPU
capture, whose allocator reserves nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchlens.analysis.frames import site_of
from torchlens.analysis.memory import fragmentation, history, leaks, oom
from torchlens.analysis.memory.allocator import AllocatorConfig
from torchlens.analysis.memory.allocator.config import round_size
from torchlens.analysis.memory.categories import compile_custom
from torchlens.analysis.memory.peak import (
    NOTHING,
    SEGMENTS_ONLY,
    STATS_ONLY,
    PeakAnalysis,
    analyze_peak,
    no_history,
)
from torchlens.analysis.memory.timeline import (
    MemoryTimeline,
    SiteRow,
    alive_at,
    build_timeline,
    rebase,
    top_sites,
    x_of,
)
from torchlens.analysis.memory.timeline_categories import (
    CategorySeries,
    category_series,
)
from torchlens.analysis.memory.what_if import ModelRun, compare, real_figures, run_model
from torchlens.model import GpumemPayload, Profile
from torchlens.model.snapshot import Snapshot, TraceEntry
from torchlens.model.units import format_bytes


@dataclass
class MemoryAnalysis:
    """The figures and tables of one gpumem profile."""

    measured_on: str  # "cuda", "cpu" or "snapshot"
    snapshot: Snapshot
    trace: list[TraceEntry]
    timeline: MemoryTimeline
    reserved_source: str
    frag_snapshot: Snapshot  # what the fragmentation panel draws
    frag: fragmentation.FragmentationSummary
    survivors: list[leaks.LeakRow]
    growth: list[leaks.RunGrowth]
    stats_after: dict[str, int]  # torch's memory_stats() after the cell ({} on CPU)
    model: ModelRun | None = None  # CPU capture: the model behind reserved/fragmentation
    simulated: ModelRun | None = None  # --simulate on a real snapshot: the "what if"
    comparison: list[tuple[str, int | None, int, bool]] = field(default_factory=list)
    diagnosis: oom.OomDiagnosis | None = None
    notes: list[str] = field(default_factory=list)
    sites: list[SiteRow] = field(default_factory=list)  # top allocation sites
    segments: list[fragmentation.SegmentMap] = field(default_factory=list)  # the block map
    #: share of reserved memory free but too small for the cell's largest request
    unusable_for_largest: tuple[int, float] | None = None
    steady_growth: int | None = None  # bytes per run after the first (--repeat)
    #: where the diagnosed OOM happened on the timeline's x axis (``timeline.t_us`` units)
    oom_x: int | None = None
    #: the shell's cell file names -> In[N] (``GpumemPayload.cells``), for stacks
    cells: dict[str, int] = field(default_factory=dict)
    #: False: no snapshot could be taken (cudaMallocAsync): no segments to show
    segments_measured: bool = True
    #: what was alive at the peak (``analysis.memory.peak``), by inferred category and site
    peak: PeakAnalysis | None = None
    #: why ``sites`` is empty when there is no history to name them ('' otherwise)
    sites_missing: str = ""
    #: which history is missing (``peak.SEGMENTS_ONLY``, ``STATS_ONLY``, ``NOTHING``; '')
    history_missing: str = ""
    #: allocated bytes over time by the peak's categories (None: no history)
    category_timeline: CategorySeries | None = None

    @property
    def scope(self) -> str:
        """What the figures span, for the wording: a cell, or a loaded snapshot's recorded
        window (whose start and end are wherever recording started and the dump was made)."""
        return "the recorded window" if self.measured_on == "snapshot" else "the cell"

    @property
    def possible_leaks(self) -> list[leaks.LeakRow]:
        return [r for r in self.survivors if r.flagged]


def _config(p: GpumemPayload, snap: Snapshot) -> AllocatorConfig:
    if p.alloc_conf:
        return AllocatorConfig.parse(p.alloc_conf)
    return AllocatorConfig.from_settings(snap.allocator_settings)


def _block_size(cfg: AllocatorConfig) -> Callable[[int], int]:
    """The bytes torch's allocated_bytes counts for a request (the block, rounded); each
    distinct size rounded once (a training step repeats a few hundred sizes 13k times)."""
    memo: dict[int, int] = {}

    def size(n: int) -> int:
        out = memo.get(n)
        if out is None:
            out = memo[n] = round_size(n, cfg) if n > 0 else 0
        return out
    return size


def _stats_timeline(p: GpumemPayload) -> MemoryTimeline:
    """Start and end from memory_stats, no events between (no history)."""
    before, after = p.stats_before, p.stats_after
    tl = MemoryTimeline(start_allocated=int(before.get("allocated_bytes.all.current", 0)),
                        start_reserved=int(before.get("reserved_bytes.all.current", 0)),
                        known_peak=history.stats_peak(p))
    if after:
        tl.t_us = [max(0, (p.end_us or 0) - (p.start_us or 0))]
        tl.allocated = [int(after.get("allocated_bytes.all.current", 0))]
        tl.reserved = [int(after.get("reserved_bytes.all.current", 0))]
    return tl


def _measured_timeline(p: GpumemPayload, snap: Snapshot, trace: list[TraceEntry],
                       rounding: Callable[[int], int] | None, notes: list[str]) -> MemoryTimeline:
    """The timeline of a CUDA capture or a loaded snapshot, from the best base there is:
    stats_before; for a wrapped history, stats_after less the kept entries' change; for a
    file, its segments less the trace's change."""
    # the levels at the start need the trace's net change: one walk from 0, then shifted
    probe = build_timeline(trace, cells=p.cells, block_size=rounding)
    alloc_delta = probe.end_allocated - probe.start_allocated
    res_delta = probe.end_reserved - probe.start_reserved
    start_alloc = p.stats_before.get("allocated_bytes.all.current")
    start_res = p.stats_before.get("reserved_bytes.all.current")
    base_from_stats = start_alloc
    base = None
    if p.history_full:
        base = history.wrapped_base(p, alloc_delta)
        end_res = p.stats_after.get("reserved_bytes.all.current")
        start_alloc = base
        start_res = None if end_res is None else end_res - res_delta
    if start_alloc is None or start_res is None:
        final = fragmentation.summarize(snap)
        if start_alloc is None:
            start_alloc = final.allocated - alloc_delta
            if start_alloc < probe.unknown_freed_bytes:
                # what the history frees from before the window was alive at its start
                notes.append(
                    f"The snapshot's segments hold {format_bytes(final.allocated)} allocated, "
                    "less than its history leaves alive at the end "
                    f"({format_bytes(alloc_delta + probe.unknown_freed_bytes)}): segments and "
                    "history disagree, so the timeline starts from the "
                    f"{format_bytes(probe.unknown_freed_bytes)} the history frees from before "
                    "the window.")
                start_alloc = probe.unknown_freed_bytes
        start_res = final.reserved - res_delta if start_res is None else start_res
    tl = rebase(probe, start_alloc, start_res)
    notes += history.history_notes(p, unknown_frees=tl.unknown_frees,
                                   unknown_bytes=tl.unknown_freed_bytes,
                                   start_from_stats=base_from_stats, base=base)
    notes += _stats_check(p, tl)
    return tl


def _stats_check(p: GpumemPayload, tl: MemoryTimeline) -> list[str]:
    """Say where the trace's figures and torch's own allocated_bytes disagree."""
    end = p.stats_after.get("allocated_bytes.all.current")
    peak = history.stats_peak(p)
    out = []
    for what, ours, theirs in (("end", tl.end_allocated, end), ("peak", tl.peak_allocated, peak)):
        if theirs is not None and ours != theirs:
            out.append(f"Allocated at the {what} from the history is {format_bytes(ours)}, "
                       f"torch.cuda.memory_stats says {format_bytes(theirs)}: torch counts a "
                       "block handed out whole (too small a remainder to split) at its full "
                       "size, the history has the requested size.")
    return out


def _cpu_start_note(tl: MemoryTimeline) -> str:
    if not tl.start_inferred:
        return "Allocated bytes count from the start of the cell (CPU allocator)."
    return (f"Allocated bytes include {format_bytes(tl.start_allocated)} alive at the start of the "
            f"cell, inferred from {tl.unknown_frees:,} frees of memory allocated before it (the "
            "CPU allocator reports no total; more may have been alive). Reserved memory (the "
            "allocator model) counts only the cell's own allocations.")


@dataclass
class PeakPart:
    """The timeline and its peak with categories and sites: what ``result.peak()`` and
    ``result.categories()`` need, made without the rest of the report (fragmentation,
    leaks, top sites, the OOM diagnosis). ``analyze`` builds on it, so a report after
    the peak walks the trace no second time."""

    view: history.DeviceView
    timeline: MemoryTimeline
    peak: PeakAnalysis
    notes: list[str]
    rounding: Callable[[int], int] | None
    frag_snap: Snapshot
    reserved_source: str
    model: ModelRun | None
    simulated: ModelRun | None
    custom: list[tuple[str, Any]]


def _no_history_why(history: bool, measured_on: str) -> str:
    """Why a result has no allocation history to analyse the peak from."""
    return STATS_ONLY if not history else (
        SEGMENTS_ONLY if measured_on == "snapshot" else NOTHING)


def peak_part(profile: Profile, *, categories: Mapping[str, str] | None = None) -> PeakPart:
    """The timeline of a ``kind="gpumem"`` profile and what was alive at its peak;
    ``categories`` as ``analyze``'s."""
    custom = compile_custom(categories)
    p: GpumemPayload = profile.payload  # type: ignore[assignment]
    raw = next(iter(profile.snapshots.values()), None) or Snapshot()
    measured_on = p.measured_on
    # the CPU stand-in has one trace, index 0, whatever --device said
    view = history.device_view(raw, 0 if measured_on == "cpu" else p.recorded.device,
                               known=measured_on == "cuda")
    snap, trace, notes = view.snapshot, view.trace, list(view.notes)
    model = simulated = None
    rounding = None if measured_on == "cpu" else _block_size(_config(p, snap))
    if not p.history:
        tl = _stats_timeline(p)
        frag_snap, reserved_source = snap, "memory_stats"
        notes += history.stats_only_notes(p)
    elif measured_on == "cpu":
        model = run_model(trace, _config(p, snap), capacity=p.capacity)
        tl = build_timeline(trace, reserved_steps=model.reserved_steps, infer_start=True,
                            cells=p.cells)
        frag_snap, reserved_source = model.snapshot, "allocator model"
        notes.append(_cpu_start_note(tl))
    else:
        tl = _measured_timeline(p, snap, trace, rounding, notes)
        frag_snap, reserved_source = snap, "snapshot"
        if p.simulate:
            simulated = run_model(trace, _config(p, snap), capacity=p.capacity,
                                  start_snapshot=snap)
    peak = (analyze_peak(tl, trace, snap, block_size=rounding, cells=p.cells, custom=custom,
                         wrapped=p.history_full, device=view.device,
                         torch_error=p.categories_error)
            if p.history and trace else
            no_history(tl.peak_allocated, _no_history_why(p.history, measured_on)))
    return PeakPart(view, tl, peak, notes, rounding, frag_snap, reserved_source, model,
                    simulated, custom)


def analyze(profile: Profile, *, categories: Mapping[str, str] | None = None,
            part: PeakPart | None = None) -> MemoryAnalysis:
    """Build the analysis of a ``kind="gpumem"`` profile; ``categories``: the user's own
    ``{name: regex}`` for the peak's categories, matched before torchlens' rules;
    ``part``: its ``peak_part`` when already made (with the same ``categories``)."""
    part = part or peak_part(profile, categories=categories)
    p: GpumemPayload = profile.payload  # type: ignore[assignment]
    measured_on, stats_after = p.measured_on, p.stats_after
    snap, trace, notes = part.view.snapshot, part.view.trace, list(part.notes)
    tl, frag_snap, model, simulated = part.timeline, part.frag_snap, part.model, part.simulated
    frag = fragmentation.summarize(frag_snap)
    if measured_on == "cuda":
        frag.torch_inactive_split = stats_after.get("inactive_split_bytes.all.current")
    surv = leaks.survivors(tl, repeated_only=measured_on == "snapshot",
                           before=leaks.from_before(snap, tl) if measured_on == "snapshot"
                           else None)
    runs = [tuple(r) for r in p.runs]
    growth = leaks.growth_per_run(tl, runs) if len(runs) > 1 else []
    a = MemoryAnalysis(measured_on, snap, trace, tl, part.reserved_source, frag_snap, frag,
                       surv, growth, stats_after, model, simulated, notes=notes,
                       sites=top_sites(tl, p.top), segments=fragmentation.segment_map(frag_snap),
                       steady_growth=leaks.steady_growth(growth) if growth else None,
                       cells=dict(p.cells), segments_measured=p.history)
    a.peak = part.peak
    if not (p.history and trace):
        a.history_missing = _no_history_why(p.history, measured_on)
        a.sites_missing = {STATS_ONLY: "no allocation history was recorded (cudaMallocAsync):"
                                       " which lines allocated is not known",
                           SEGMENTS_ONLY: "no allocation history (the snapshot has segments "
                                          "only): which lines allocated is not known",
                           NOTHING: f"nothing was allocated in {a.scope}"}[a.history_missing]
    a.category_timeline = category_series(tl, a.peak)
    biggest = max((x.size for x in tl.allocations), default=0)
    if biggest:
        a.unusable_for_largest = (biggest, fragmentation.unusable_free_share(frag_snap, biggest))
    what_if = simulated or (model if p.simulate else None)
    if what_if is not None:
        real = real_figures(snap, trace, stats_after or None, peak_allocated=tl.peak_allocated,
                            end_allocated=tl.end_allocated, cpu=measured_on == "cpu")
        a.comparison = compare(real, what_if)
        notes += what_if.notes
    a.diagnosis = _diagnose(profile, a, what_if)
    return a


def _is_training(tl: MemoryTimeline) -> bool:
    """Whether the trace shows a backward pass (so batch-size advice can apply)."""
    return any("backward" in f.name or "autograd::Engine" in f.name
               for a in tl.allocations for f in a.frames)


def _diagnose(profile: Profile, a: MemoryAnalysis, what_if: ModelRun | None) -> oom.OomDiagnosis | None:
    """The OOM diagnosis and where it lies on the timeline (``a.oom_x``)."""
    error = profile.error
    message = error.get("message") if oom.is_oom_error(error) else None
    tl, trace = a.timeline, a.trace
    scope = "this recorded window" if a.measured_on == "snapshot" else "this cell"

    def alive(idx: int) -> list[oom.AliveSite]:
        return [oom.AliveSite(*x) for x in alive_at(tl, idx)]

    real = None
    if message or any(e.action == "oom" for e in trace):
        idx = next((i for i in range(len(trace) - 1, -1, -1) if trace[i].action == "oom"),
                   len(trace))
        entry = trace[idx] if idx < len(trace) else None
        last = entry if entry and entry.frames else next(
            (e for e in reversed(trace) if e.action == "alloc"), None)
        real = oom.from_snapshot(a.snapshot, trace=trace, message=message, leaks=a.survivors,
                                 site=site_of(last.frames, a.cells)[0] if last else None,
                                 alive=alive(idx), training=_is_training(tl), scope=scope)
        if real is not None:
            a.oom_x = x_of(tl, trace, idx) if trace else None
    if real is not None and a.measured_on != "cpu":
        return real
    if what_if is not None and what_if.ooms:
        idx, first = what_if.ooms[0]
        site = site_of(trace[idx].frames, a.cells)[0] if idx < len(trace) else None
        a.oom_x = x_of(tl, trace, idx)
        return oom.from_model_oom(first, what_if.snapshot, leaks=a.survivors, site=site,
                                  expandable=what_if.config.expandable_segments,
                                  alive=alive(idx), training=_is_training(tl), scope=scope)
    return real
