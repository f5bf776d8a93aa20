"""Everything a ``gpumem`` report shows, computed once from a Profile (pure, no torch).

The render layer and the result object both read a ``MemoryAnalysis``, so the
HTML, the text fallback and ``result.leaks()`` can never disagree. Where the
figures come from is decided here and recorded in ``reserved_source``: a real
snapshot (CUDA capture or a loaded file) or the allocator model (a CPU
capture, whose allocator reserves nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchlens.analysis.frames import site_of
from torchlens.analysis.memory import fragmentation, leaks, oom
from torchlens.analysis.memory.allocator import AllocatorConfig
from torchlens.analysis.memory.timeline import (
    MemoryTimeline,
    SiteRow,
    alive_at,
    build_timeline,
    top_sites,
    x_of,
)
from torchlens.analysis.memory.what_if import ModelRun, compare, real_figures, run_model
from torchlens.model import GpumemPayload, Profile
from torchlens.model.units import format_bytes


@dataclass
class MemoryAnalysis:
    """The figures and tables of one gpumem profile."""

    measured_on: str  # "cuda", "cpu" or "snapshot"
    snapshot: dict[str, Any]
    trace: list[dict[str, Any]]
    timeline: MemoryTimeline
    reserved_source: str
    frag_snapshot: dict[str, Any]  # what the fragmentation panel draws
    frag: fragmentation.FragmentationSummary
    survivors: list[leaks.LeakRow]
    growth: list[leaks.RunGrowth]
    stats_after: dict[str, Any]
    model: ModelRun | None = None  # CPU capture: the model behind reserved/fragmentation
    simulated: ModelRun | None = None  # --simulate on a real snapshot: the "what if"
    comparison: list[tuple[str, int | None, int, bool]] = field(default_factory=list)
    diagnosis: oom.OomDiagnosis | None = None
    notes: list[str] = field(default_factory=list)
    sites: list[SiteRow] = field(default_factory=list)  # top allocation sites
    segments: list[dict[str, Any]] = field(default_factory=list)  # the block map
    #: share of reserved memory free but too small for the cell's largest request
    unusable_for_largest: tuple[int, float] | None = None
    steady_growth: int | None = None  # bytes per run after the first (--repeat)
    #: where the diagnosed OOM happened on the timeline's x axis (``timeline.t_us`` units)
    oom_x: int | None = None
    #: the shell's cell file names -> In[N] (``GpumemPayload.cells``), for stacks
    cells: dict[str, int] = field(default_factory=dict)

    @property
    def scope(self) -> str:
        """What the figures span, for the wording: a cell, or a loaded snapshot's recorded
        window (whose start and end are wherever recording started and the dump was made)."""
        return "the recorded window" if self.measured_on == "snapshot" else "the cell"

    @property
    def possible_leaks(self) -> list[leaks.LeakRow]:
        return [r for r in self.survivors if r.flagged]


def _pick_trace(snap: dict[str, Any], device: int) -> list[dict[str, Any]]:
    traces = snap.get("device_traces") or []
    if device < len(traces) and traces[device]:
        return traces[device]
    return next((t for t in traces if t), [])


def _config(p: GpumemPayload, snap: dict[str, Any]) -> AllocatorConfig:
    if p.alloc_conf:
        return AllocatorConfig.parse(p.alloc_conf)
    return AllocatorConfig.from_settings(snap.get("allocator_settings"))


def _cpu_start_note(tl: MemoryTimeline) -> str:
    if not tl.start_inferred:
        return "Allocated bytes count from the start of the cell (CPU allocator)."
    return (f"Allocated bytes include {format_bytes(tl.start_allocated)} alive at the start of the "
            f"cell, inferred from {tl.unknown_frees:,} frees of memory allocated before it (the "
            "CPU allocator reports no total; more may have been alive). Reserved memory (the "
            "allocator model) counts only the cell's own allocations.")


def analyze(profile: Profile) -> MemoryAnalysis:
    """Build the analysis of a ``kind="gpumem"`` profile."""
    p: GpumemPayload = profile.payload  # type: ignore[assignment]
    snap = next(iter(profile.snapshots.values()), {"segments": [], "device_traces": []})
    trace = _pick_trace(snap, p.recorded.device)
    measured_on, stats_before, stats_after = p.measured_on, p.stats_before, p.stats_after
    notes: list[str] = []
    capacity = p.capacity
    model = simulated = None
    if measured_on == "cpu":
        model = run_model(trace, _config(p, snap), capacity=capacity)
        tl = build_timeline(trace, reserved_steps=model.reserved_steps, infer_start=True,
                            cells=p.cells)
        frag_snap, reserved_source = model.snapshot, "allocator model"
        notes.append(_cpu_start_note(tl))
    else:
        start_alloc = stats_before.get("allocated_bytes.all.current")
        start_res = stats_before.get("reserved_bytes.all.current")
        if start_alloc is None or start_res is None:
            # A loaded snapshot: work back from its final state over the trace.
            probe = build_timeline(trace)
            final = fragmentation.summarize(snap, device=None)
            start_alloc = final.allocated - (probe.end_allocated - probe.start_allocated)
            start_res = final.reserved - (probe.end_reserved - probe.start_reserved)
        tl = build_timeline(trace, start_allocated=start_alloc, start_reserved=start_res,
                            cells=p.cells)
        frag_snap, reserved_source = snap, "snapshot"
        if p.simulate:
            simulated = run_model(trace, _config(p, snap), capacity=capacity,
                                  start_snapshot=snap)
    frag = fragmentation.summarize(frag_snap)
    surv = leaks.survivors(tl, repeated_only=measured_on == "snapshot")
    runs = [tuple(r) for r in p.runs]
    growth = leaks.growth_per_run(tl, runs) if len(runs) > 1 else []
    a = MemoryAnalysis(measured_on, snap, trace, tl, reserved_source, frag_snap, frag, surv,
                       growth, stats_after, model, simulated, notes=notes,
                       sites=top_sites(tl, p.top), segments=fragmentation.segment_map(frag_snap),
                       steady_growth=leaks.steady_growth(growth) if growth else None,
                       cells=dict(p.cells))
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
    return any("backward" in (f.get("name") or "") or "autograd::Engine" in (f.get("name") or "")
               for a in tl.allocations for f in a.frames)


def _diagnose(profile: Profile, a: MemoryAnalysis, what_if: ModelRun | None) -> oom.OomDiagnosis | None:
    """The OOM diagnosis and where it lies on the timeline (``a.oom_x``)."""
    error = profile.error
    message = error.get("message") if oom.is_oom_error(error) else None
    tl, trace = a.timeline, a.trace
    scope = "this recorded window" if a.measured_on == "snapshot" else "this cell"

    def context(idx: int) -> dict[str, Any]:
        alive = [oom.AliveSite(*x) for x in alive_at(tl, idx)]
        return {"alive": alive, "training": _is_training(tl), "scope": scope}

    real = None
    if message or any(e["action"] == "oom" for e in trace):
        idx = next((i for i in range(len(trace) - 1, -1, -1) if trace[i]["action"] == "oom"),
                   len(trace))
        entry = trace[idx] if idx < len(trace) else None
        last = entry if entry and entry.get("frames") else next(
            (e for e in reversed(trace) if e["action"] == "alloc"), None)
        real = oom.from_snapshot(a.snapshot, trace=trace, message=message, leaks=a.survivors,
                                 site=site_of(last["frames"], a.cells)[0] if last else None,
                                 **context(idx))
        if real is not None:
            a.oom_x = x_of(tl, trace, idx) if trace else None
    if real is not None and a.measured_on != "cpu":
        return real
    if what_if is not None and what_if.ooms:
        idx, first = what_if.ooms[0]
        site = site_of(trace[idx].get("frames") or [], a.cells)[0] if idx < len(trace) else None
        a.oom_x = x_of(tl, trace, idx)
        return oom.from_model_oom(first, what_if.snapshot, leaks=a.survivors, site=site,
                                  expandable=what_if.config.expandable_segments, **context(idx))
    return real
