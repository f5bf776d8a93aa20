"""Why an allocation failed: fragmentation or real exhaustion, and what to try.

Inputs, whichever exist: the ``oom`` entry of the trace (requested size and
``device_free``), the text of ``torch.OutOfMemoryError`` (its "Tried to
allocate ... of which ... is free ... reserved by PyTorch but unallocated"
figures), the snapshot (cached free blocks per pool), or an OOM of the
allocator model (``--simulate --capacity``). Every piece of advice carries the
figure that supports it, so the user can judge it rather than trust it.

Fragmentation: reserved-but-free plus device-free memory would hold the
request, but no single usable block or new segment does. Exhaustion: the
request does not fit even if every free byte could be used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from . import fragmentation
from .allocator.config import SMALL_SIZE, AllocatorConfig, round_size
from .leaks import LeakRow

_SIZE = r"([\d.]+)\s*(B|KiB|MiB|GiB|TiB)"
_MULT = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}


def fmt_bytes(n: float | None) -> str:
    """Human-readable bytes, binary units as torch prints them."""
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    return f"{sign}{n:.2f} GiB"


def _find(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    return int(float(m.group(1)) * _MULT[m.group(2)]) if m else None


def parse_oom_message(message: str) -> dict[str, int | None]:
    """Figures from torch's OutOfMemoryError text (None where the text lacks them)."""
    return {
        "requested": _find(r"Tried to allocate " + _SIZE, message),
        "capacity": _find(r"total capacity of " + _SIZE, message),
        "device_free": _find(r"of which " + _SIZE + r" is free", message),
        "allocated": _find(_SIZE + r" is allocated by PyTorch", message),
        "free_cached": _find(_SIZE + r" is reserved by PyTorch but unallocated", message),
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
class OomDiagnosis:
    """The failed request, the free memory around it, the cause and advice."""

    source: str
    requested: int | None
    device_free: int | None = None
    capacity: int | None = None
    reserved: int | None = None
    allocated: int | None = None
    free_cached: int | None = None  # reserved by the allocator but not allocated
    largest_usable: int | None = None  # largest cached block the request could use
    inactive_split: int | None = None
    unusable_share: float | None = None
    segment_size: int | None = None  # the new segment the allocator tried to reserve
    cause: str = "unknown"
    explanation: str = ""
    site: str | None = None
    advice: list[Advice] = field(default_factory=list)


def diagnose(d: OomDiagnosis, leaks: list[LeakRow] | None = None) -> OomDiagnosis:
    """Fill ``cause``, ``explanation`` and ``advice`` from the figures in ``d``."""
    req = d.requested
    if req is None:
        d.explanation = "The request size is unknown; no diagnosis."
        return d
    device_free = d.device_free or 0
    if d.segment_size is not None and device_free < d.segment_size:
        device_free = 0  # too little for the segment a request of this size gets
    total_free = (d.free_cached or 0) + device_free
    largest = d.largest_usable or 0
    if d.free_cached is not None and total_free >= req and largest < req:
        d.cause = "fragmentation"
        d.explanation = (
            f"{fmt_bytes(req)} was requested while {fmt_bytes(total_free)} was free in total "
            f"({fmt_bytes(d.free_cached)} cached by the allocator, {fmt_bytes(d.device_free)} "
            f"on the device), but the largest usable free block was {fmt_bytes(largest)}: "
            "the free memory is in pieces too small for the request."
        )
        d.advice.append(Advice(
            "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA starts",
            f"{fmt_bytes(d.free_cached)} is reserved but free in blocks no larger than "
            f"{fmt_bytes(largest)}; expandable segments grow one mapping instead of "
            "stranding free pieces between segments."))
        if d.inactive_split:
            mb = max(20, min(512, 1 << max(0, (req // (1024 * 1024)).bit_length() - 1)))
            d.advice.append(Advice(
                f"Or set max_split_size_mb:{mb} so large cached blocks are not split",
                f"{fmt_bytes(d.inactive_split)} is free inside split segments "
                "(inactive_split), which only a request that fits the gap can reuse."))
    else:
        d.cause = "exhaustion"
        short = req - total_free
        d.explanation = (
            f"{fmt_bytes(req)} was requested but only {fmt_bytes(total_free)} was free in total"
            + (f" on a {fmt_bytes(d.capacity)} device" if d.capacity else "")
            + (f"; {fmt_bytes(d.allocated)} is allocated by tensors" if d.allocated is not None else "")
            + ": the memory is really used, not fragmented."
        )
        if d.segment_size is not None and (d.device_free or 0) < d.segment_size:
            d.explanation += (
                f" A request of this size needs a new {fmt_bytes(d.segment_size)} segment "
                f"and the device had {fmt_bytes(d.device_free)} left.")
        if d.allocated:
            cut = min(0.9, (short + d.allocated * 0.05) / d.allocated) if short > 0 else 0.1
            d.advice.append(Advice(
                f"Use a smaller batch (about {cut:.0%} smaller) or activation checkpointing",
                f"{fmt_bytes(d.allocated)} is allocated and the request is "
                f"{fmt_bytes(max(short, 0))} short of fitting."))
    for leak in (leaks or [])[:3]:
        if not leak.flagged:
            continue
        d.advice.append(Advice(
            f"Free what {leak.site} keeps alive ({leak.function})",
            f"{fmt_bytes(leak.bytes)} allocated there in {leak.passes} passes of this cell is "
            f"still alive ({leak.count} tensors), e.g. losses kept with their graphs; keep "
            "loss.item() or .detach() instead."))
    return d


def _pool_figures(snapshot: dict[str, Any], req: int, cfg: AllocatorConfig) -> dict[str, Any]:
    s = fragmentation.summarize(snapshot)
    pool = "small" if round_size(req, cfg) <= SMALL_SIZE else "large"
    usable = max((b["size"] for seg in snapshot.get("segments", [])
                  if (seg.get("segment_type") == "small") == (pool == "small")
                  for b in seg.get("blocks", [])
                  if b["state"] == "inactive" and fragmentation.can_serve(b["size"], req, cfg)),
                 default=0)
    return {"reserved": s.reserved, "allocated": s.allocated, "free_cached": s.free_cached,
            "largest_usable": usable, "inactive_split": s.inactive_split,
            "unusable_share": fragmentation.unusable_free_share(snapshot, req, config=cfg)}


def from_snapshot(
    snapshot: dict[str, Any],
    *,
    trace: list[dict[str, Any]] | None = None,
    message: str | None = None,
    leaks: list[LeakRow] | None = None,
    site: str | None = None,
) -> OomDiagnosis | None:
    """Diagnose the last OOM recorded in ``trace`` and/or ``message``; None if neither has one."""
    entry = next((e for e in reversed(trace or []) if e["action"] == "oom"), None)
    parsed = parse_oom_message(message) if message else {}
    req = parsed.get("requested") or (entry["size"] if entry else None)
    if req is None:
        return None
    cfg = AllocatorConfig.from_settings(snapshot.get("allocator_settings"))
    d = OomDiagnosis(source="trace oom entry" if entry else "error message", requested=req)
    d.device_free = entry.get("device_free") if entry else parsed.get("device_free")
    if d.device_free is None:
        d.device_free = parsed.get("device_free")
    d.capacity = parsed.get("capacity")
    if snapshot.get("segments"):
        for k, v in _pool_figures(snapshot, req, cfg).items():
            setattr(d, k, v)
    else:
        d.allocated = parsed.get("allocated")
        d.free_cached = parsed.get("free_cached")
    d.site = site
    return diagnose(d, leaks)


def from_model_oom(oom: Any, snapshot: dict[str, Any], *, leaks: list[LeakRow] | None = None,
                   site: str | None = None) -> OomDiagnosis:
    """Diagnose an OOM of the allocator model (``allocator.OOM`` figures + its snapshot)."""
    s = fragmentation.summarize(snapshot)
    d = OomDiagnosis(
        source="allocator model (simulated)", requested=oom.requested,
        device_free=oom.device_free, capacity=oom.capacity, reserved=oom.reserved,
        allocated=oom.allocated, free_cached=oom.free_cached,
        largest_usable=oom.largest_free_in_pool, inactive_split=s.inactive_split, site=site,
        segment_size=oom.alloc_size)
    return diagnose(d, leaks)
