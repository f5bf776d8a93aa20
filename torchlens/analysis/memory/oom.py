"""Why an allocation failed: fragmentation or real exhaustion, and what to try.

Inputs, whichever exist: the ``oom`` entry of the trace (requested size and
``device_free``), the text of ``torch.OutOfMemoryError`` (its "Tried to
allocate ... of which ... is free ... reserved by PyTorch but unallocated"
figures), the snapshot (cached free blocks per pool), or an OOM of the
allocator model (``--simulate --capacity``). Every piece of advice carries the
figure that supports it, so the user can judge it rather than trust it.

Fragmentation: the cached free memory, plus the device's free memory when it
is enough for the new segment a request of this size gets, would hold the
request, but no single usable cached block does. Exhaustion: otherwise; the
shortfall is what the request lacks (when it needs a new segment: the
segment's size minus the device's free bytes, e.g. a 4 MiB request needs a new
20 MiB segment, so 4 MiB free on the device leaves it 16 MiB short).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torchlens.analysis.memory import fragmentation
from torchlens.analysis.memory.allocator.config import (
    SMALL_SIZE,
    AllocatorConfig,
    allocation_size,
    round_size,
)
from torchlens.analysis.memory.allocator.core import OOM
from torchlens.analysis.memory.leaks import LeakRow
from torchlens.model.findings import FAILED, Figure, Finding
from torchlens.model.snapshot import Snapshot, TraceEntry
from torchlens.model.units import format_bytes

# c10/cuda/CUDACachingAllocator.cpp format_size: "N bytes" up to 1024 bytes,
# then "%.2f KiB" / "MiB" / "GiB" (GiB has no upper unit: "1536.00 GiB").
_SIZE = r"([\d.]+)\s*(bytes|B|KiB|MiB|GiB|TiB)"
_MULT = {"bytes": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}


def _find(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    return int(float(m.group(1)) * _MULT[m.group(2)]) if m else None


def parse_oom_message(message: str) -> dict[str, int | None]:
    """Figures from torch's OutOfMemoryError text (None where the text lacks them)."""
    return {
        "requested": _find(r"Tried to allocate " + _SIZE, message),
        # torch < 2.2 printed "total capacty of"
        "capacity": _find(r"total capac(?:i)?ty of " + _SIZE, message),
        "device_free": _find(r"of which " + _SIZE + r" is free", message),
        "allocated": _find(_SIZE + r" is allocated by PyTorch", message),
        "free_cached": _find(_SIZE + r" is reserved by PyTorch but unallocated", message),
        # set_per_process_memory_fraction: the allocator refuses past this limit
        # whatever the device has free (CUDACachingAllocator's "N allowed;")
        "allowed": _find(_SIZE + r" allowed;", message),
    }


def is_oom_error(error: dict[str, str] | None) -> bool:
    """Whether a recorded exception is an out-of-memory error (CUDA or the model's)."""
    if not error:
        return False
    return error.get("type") == "OutOfMemoryError" or "out of memory" in error.get("message", "")


@dataclass
class Advice:
    """One thing to try, and the figure that says why."""

    action: str
    evidence: str


@dataclass
class AliveSite:
    """Bytes one site kept alive when the failing allocation ran."""

    site: str
    bytes: int
    count: int


@dataclass
class OomDiagnosis:
    """The failed request, the free memory around it, the cause and advice.

    ``total_free``, ``usable_free``, ``shortfall`` are derived once here
    (``diagnose``); the finding (its sentence and figures), the table and the
    chart all read them, so they cannot disagree. ``advice``: each thing to
    try with its evidence, as the finding's advice says them.
    """

    source: str
    requested: int | None
    device_free: int | None = None
    capacity: int | None = None
    reserved: int | None = None
    allocated: int | None = None
    free_cached: int | None = None  # reserved by the allocator but not allocated
    #: the process's limit (``set_per_process_memory_fraction``); then ``capacity`` is
    #: that limit and ``device_free`` what was left under it, not the device's free
    limit: int | None = None
    largest_usable: int | None = None  # largest cached block the request could use
    inactive_split: int | None = None
    unusable_share: float | None = None
    segment_size: int | None = None  # the new segment the allocator tried to reserve
    cause: str = "unknown"
    finding: Finding = field(default_factory=lambda: Finding(FAILED, ""))
    site: str | None = None
    advice: list[Advice] = field(default_factory=list)
    total_free: int | None = None  # free_cached + device_free
    usable_free: int | None = None  # the largest single piece of it this request could use
    shortfall: int | None = None  # exhaustion: bytes missing for the request to succeed
    alive: list[AliveSite] = field(default_factory=list)  # biggest sites alive at the failure
    training: bool = False  # the trace shows a backward pass (batch advice applies)
    expandable: bool = False  # expandable_segments was on

    @property
    def explanation(self) -> str:
        """The finding's sentence, under the name scripts read before it was a Finding."""
        return self.finding.sentence


def _derive(d: OomDiagnosis, req: int) -> None:
    """The free figures every view shows, and the cause they imply."""
    cached = d.free_cached or 0
    device = d.device_free or 0
    d.total_free = cached + device
    # Device memory serves this request only as a whole new segment.
    device_usable = device if d.segment_size is None or device >= d.segment_size else 0
    largest = d.largest_usable or 0
    d.usable_free = max(largest, device_usable)
    if d.free_cached is not None and cached + device_usable >= req and largest < req:
        d.cause = "fragmentation"  # the pieces would hold it, none does alone
        return
    d.cause = "exhaustion"
    if d.segment_size is not None and device < d.segment_size and largest < req:
        d.shortfall = d.segment_size - device
    else:
        d.shortfall = max(0, req - cached - device_usable)


def diagnose(d: OomDiagnosis, leaks: list[LeakRow] | None = None, *,
             scope: str = "this cell") -> OomDiagnosis:
    """Fill the derived figures, ``cause``, ``explanation`` and ``advice`` from ``d``."""
    req = d.requested
    if req is None:
        d.finding = Finding(FAILED, "The request size is unknown; no diagnosis.",
                            title="Out of memory", code="out_of_memory")
        return d
    _derive(d, req)
    largest = d.largest_usable or 0
    free_text = (f"{format_bytes(d.total_free)} was free in total ({format_bytes(d.free_cached or 0)} "
                 f"cached by the allocator, {format_bytes(d.device_free or 0)} "
                 + (f"left under this process's limit of {format_bytes(d.limit)} "
                    "(set_per_process_memory_fraction)" if d.limit else "on the device"
                    + (f" of {format_bytes(d.capacity)}" if d.capacity else "")) + ")")
    needs_segment = (d.segment_size is not None and (d.device_free or 0) < d.segment_size)
    segment_text = (f"a request of this size needs a new {format_bytes(d.segment_size)} segment "
                    f"and the device had {format_bytes(d.device_free or 0)} free"
                    if needs_segment else "")
    if d.cause == "fragmentation":
        explanation = (
            f"{format_bytes(req)} was requested while {free_text}, but the largest usable cached "
            f"block was {format_bytes(largest)}"
            + (f" and {segment_text}" if segment_text else "")
            + ": the free memory is in pieces too small for the request.")
        d.advice.append(Advice(
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA starts",
            f"{format_bytes(d.free_cached)} is reserved but free in blocks none of which can "
            f"hold {format_bytes(req)}; expandable segments grow one mapping instead of "
            "stranding free pieces between segments."))
        if d.inactive_split:
            mb = max(20, min(512, 1 << max(0, (req // (1024 * 1024)).bit_length() - 1)))
            d.advice.append(Advice(
                f"Or set max_split_size_mb:{mb} so large cached blocks are not split",
                f"{format_bytes(d.inactive_split)} is free inside split segments "
                "(inactive_split), which only a request that fits the gap can reuse."))
    else:
        explanation = (
            f"{format_bytes(req)} was requested; {free_text}, and the largest piece this request "
            f"could use was {format_bytes(d.usable_free)}"
            + (f" ({segment_text})" if segment_text else "")
            + (f"; {format_bytes(d.allocated)} is allocated by tensors" if d.allocated is not None else "")
            + ": the memory is really used, not fragmented. "
            + (f"The {'process' if d.limit else 'device'} is {format_bytes(d.shortfall)} short "
               "of that segment."
               if needs_segment else f"The request is {format_bytes(d.shortfall)} short of fitting."))
        _exhaustion_advice(d, req, needs_segment)
    for leak in (leaks or [])[:3]:
        if not leak.flagged:
            continue
        d.advice.append(Advice(
            f"Free what {leak.site} keeps alive ({leak.function})",
            f"{format_bytes(leak.bytes)} allocated there in {leak.passes} passes of {scope} is "
            f"still alive ({leak.count} tensors), e.g. losses kept with their graphs; keep "
            "loss.item() or .detach() instead."))
    d.finding = Finding(FAILED, explanation, figures(d),
                        " ".join(f"{a.action}: {a.evidence}" for a in d.advice),
                        f"Out of memory ({d.cause})", code="out_of_memory")
    return d


def figures(d: OomDiagnosis) -> tuple[Figure, ...]:
    """The figures the explanation is written from, named as the OOM box shows
    them; those not known are left out."""
    out = [Figure(name, value, "B") for name, value in (
        ("requested", d.requested), ("free on the device", d.device_free),
        ("reserved but free (cached)", d.free_cached), ("free in total", d.total_free),
        ("largest piece this request could use", d.usable_free),
        ("largest usable cached block", d.largest_usable),
        ("new segment a request of this size needs", d.segment_size),
        ("short by", d.shortfall), ("allocated", d.allocated), ("reserved", d.reserved),
        ("capacity", d.capacity), ("process limit", d.limit),
        ("inactive_split", d.inactive_split)) if value is not None]
    if d.unusable_share is not None:
        out.append(Figure("reserved memory free but unusable for this request",
                          d.unusable_share, "share"))
    if d.site:
        out.append(Figure("failing allocation at", d.site))
    return tuple(out)


def _exhaustion_advice(d: OomDiagnosis, req: int, needs_segment: bool) -> None:
    short = d.shortfall or 0
    action = "Keep less alive when this allocation runs"
    if d.training:
        action += " (in training: a smaller batch or activation checkpointing)"
    held = ", ".join(f"{x.site} {format_bytes(x.bytes)} in {x.count} tensors" for x in d.alive)
    evidence = (f"{format_bytes(d.allocated)} is allocated at that point"
                if d.allocated is not None else "At that point")
    evidence += f", the most by: {held}" if held else ""
    need = (f"one free block of {format_bytes(req)} among it, or {format_bytes(short)} more free on "
            "the device, would serve the request" if needs_segment else
            f"the request is {format_bytes(short)} short of fitting")
    d.advice.append(Advice(action, f"{evidence}; {need}."))
    pages = -(-req // (2 * 1024 * 1024)) * 2 * 1024 * 1024
    if needs_segment and not d.expandable and pages <= (d.device_free or 0):
        d.advice.append(Advice(
            "Or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA starts",
            f"segments then grow in 2 MiB pages: this request needs {format_bytes(pages)} of the "
            f"{format_bytes(d.device_free)} free instead of a new {format_bytes(d.segment_size)} "
            "segment."))
    if d.limit:
        d.advice.append(Advice(
            f"Or raise this process's limit to at least {format_bytes(d.limit + short)}",
            f"torch.cuda.set_per_process_memory_fraction allows it {format_bytes(d.limit)} and "
            f"the request is {format_bytes(short)} short."))
    elif d.capacity:
        d.advice.append(Advice(
            f"Or run on a device with at least {format_bytes(d.capacity + short)}",
            f"this one has {format_bytes(d.capacity)} and the request is {format_bytes(short)} short."))


def _set_pool_figures(d: OomDiagnosis, snapshot: Snapshot, req: int,
                      cfg: AllocatorConfig) -> None:
    """The snapshot's reserved, allocated and free figures for request ``req`` into ``d``:
    the largest free block its pool could serve it from and the free share too small."""
    s = fragmentation.summarize(snapshot)
    pool = "small" if round_size(req, cfg) <= SMALL_SIZE else "large"
    usable = max((b.size for seg in snapshot.segments
                  if (seg.segment_type == "small") == (pool == "small")
                  for b in seg.blocks
                  if b.state == "inactive" and fragmentation.can_serve(b.size, req, cfg)),
                 default=0)
    d.reserved, d.allocated, d.free_cached = s.reserved, s.allocated, s.free_cached
    d.largest_usable, d.inactive_split = usable, s.inactive_split
    d.unusable_share = fragmentation.unusable_free_share(snapshot, req, config=cfg)


def from_snapshot(
    snapshot: Snapshot,
    *,
    trace: list[TraceEntry] | None = None,
    message: str | None = None,
    leaks: list[LeakRow] | None = None,
    site: str | None = None,
    alive: list[AliveSite] | None = None,
    training: bool = False,
    scope: str = "this cell",
) -> OomDiagnosis | None:
    """Diagnose the last OOM recorded in ``trace`` and/or ``message``; None if neither has one."""
    entry = next((e for e in reversed(trace or []) if e.action == "oom"), None)
    parsed = parse_oom_message(message) if message else {}
    req = parsed.get("requested") or (entry.size if entry else None)
    if req is None:
        return None
    cfg = AllocatorConfig.from_settings(snapshot.allocator_settings)
    d = OomDiagnosis(source="trace oom entry" if entry else "error message", requested=req)
    d.device_free = entry.device_free if entry else parsed.get("device_free")
    if d.device_free is None:
        d.device_free = parsed.get("device_free")
    d.capacity = parsed.get("capacity")
    d.alive, d.training, d.expandable = alive or [], training, cfg.expandable_segments
    if not cfg.expandable_segments:
        d.segment_size = allocation_size(round_size(req, cfg))
    if snapshot.segments:
        _set_pool_figures(d, snapshot, req, cfg)
    else:
        d.allocated = parsed.get("allocated")
        d.free_cached = parsed.get("free_cached")
    _apply_limit(d, parsed.get("allowed"))
    d.site = site
    return diagnose(d, leaks, scope=scope)


def _apply_limit(d: OomDiagnosis, allowed: int | None) -> None:
    """Under a per-process limit the device's free memory is not what this
    process could get: what it could is the limit less what it has reserved."""
    if allowed is None:
        return
    reserved = d.reserved
    if reserved is None and d.allocated is not None and d.free_cached is not None:
        reserved = d.allocated + d.free_cached
    d.limit = d.capacity = allowed
    if reserved is not None:
        headroom = max(0, allowed - reserved)
        d.device_free = headroom if d.device_free is None else min(d.device_free, headroom)


def from_model_oom(oom: OOM, snapshot: Snapshot, *, leaks: list[LeakRow] | None = None,
                   site: str | None = None, alive: list[AliveSite] | None = None,
                   training: bool = False, expandable: bool = False,
                   scope: str = "this cell") -> OomDiagnosis:
    """Diagnose an OOM of the allocator model (``allocator.OOM`` figures + its snapshot)."""
    s = fragmentation.summarize(snapshot)
    d = OomDiagnosis(
        source="allocator model (simulated)", requested=oom.requested,
        device_free=oom.device_free, capacity=oom.capacity, reserved=oom.reserved,
        allocated=oom.allocated, free_cached=oom.free_cached,
        largest_usable=oom.largest_free_in_pool, inactive_split=s.inactive_split, site=site,
        segment_size=None if expandable else oom.alloc_size, alive=alive or [],
        training=training, expandable=expandable)
    return diagnose(d, leaks, scope=scope)
