"""The "peak" section of a gpumem report and its text lines: draws a ``PeakAnalysis``.

Names from a trace (sites, functions, stacks) go through the autoescaped
template ``peak.html.j2``; the stack is in a ``title`` attribute, shown on hover.
"""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup

from torchlens.analysis.frames import frame_label
from torchlens.analysis.memory.peak import GroupRow, PeakAnalysis
from torchlens.model.snapshot import Frame
from torchlens.model.units import (
    format_bytes,
    format_count,
    format_duration,
    format_percent,
)
from torchlens.render import html
from torchlens.render.memory.colours import colour_of, custom_names


def stack_text(frames: list[Frame], cells: dict[str, int] | None = None,
               n: int = 12) -> str:
    """A stack, innermost first, one frame a line (a hover's text): its Python frames
    when it has any (a CUDA stack starts with a dozen allocator C++ frames)."""
    python = [f for f in frames if f.filename.endswith(".py") or f.filename.startswith("<")]
    return "\n".join(f"{f.name} ({frame_label(f, cells)})"
                     for f in (python or frames)[:n])


def when_text(pk: PeakAnalysis, clock: str) -> str:
    """When the peak was, in the timeline's units."""
    if pk.entry is None:
        return "at the start of the window" if pk.blocks else (pk.moment or "not known")
    at = (f"{format_duration(pk.x or 0)} after the first event" if clock == "us"
          else f"trace entry {pk.entry:,}")
    return f"{at} (trace entry {pk.entry:,})" if clock == "us" else at


@dataclass(frozen=True)
class _Row:
    """One category, stage or site of the peak as the template draws it."""

    name: str
    colour: str
    bytes: int
    size: str
    share: float
    pct: str
    count: int
    count_text: str
    function: str
    categories: str
    stack: str
    why: str


def _row(r: GroupRow, cells: dict[str, int], why: dict[str, str],
         custom: list[str] | None = None) -> _Row:
    return _Row(r.name, colour_of(r.name, custom or ()), r.bytes, format_bytes(r.bytes),
                r.share, format_percent(100 * r.share), r.count, format_count(r.count),
                r.function, r.categories, stack_text(r.frames, cells), why.get(r.name, ""))


def peak_html(pk: PeakAnalysis, clock: str, cells: dict[str, int], top: int) -> Markup:
    why = dict(pk.rules)
    custom = custom_names(pk.rules)
    categories = [_row(r, cells, why, custom) for r in pk.by_category]
    trig = pk.trigger
    trigger = None if trig is None else {
        "size": format_bytes(trig.size), "site": trig.site, "category": trig.category_text,
        "stack": stack_text(trig.frames, cells)}
    return html.render(
        "peak.html.j2",
        summary=[("peak allocated", format_bytes(pk.peak)), ("when", when_text(pk, clock))],
        trigger=trigger, missing=pk.missing, inferred=pk.category_note,
        category_from=pk.category_from,
        categories=categories, bar=[c for c in categories if c.share > 0],
        stages=[_row(r, cells, why) for r in pk.by_stage],
        dtypes=[_row(r, cells, why) for r in pk.by_dtype],
        sites=[_row(r, cells, why) for r in pk.by_site[:top]])


def peak_lines(pk: PeakAnalysis, clock: str, top: int) -> list[str]:
    """The peak for the text view."""
    lines = [f"peak {format_bytes(pk.peak)} allocated, {when_text(pk, clock)}"]
    if pk.trigger is not None:
        t = pk.trigger
        lines.append(f"  made by {format_bytes(t.size)} at {t.site} ({t.category_text})")
    if pk.by_category:
        lines.append(f"  alive at the peak by category ({pk.category_from}):")
        lines += [f"  {format_bytes(r.bytes):>12}  {format_percent(100 * r.share):>6}  {r.name}"
                  for r in pk.by_category]
        lines.append("  alive at the peak by site:")
        lines += [f"  {format_bytes(r.bytes):>12}  {format_percent(100 * r.share):>6}  {r.name}"
                  f"  ({r.categories})" for r in pk.by_site[:top]]
    if pk.by_dtype:
        lines.append("  alive at the peak by dtype (as torch's memory profiler saw each tensor):")
        lines += [f"  {format_bytes(r.bytes):>12}  {format_percent(100 * r.share):>6}  {r.name}"
                  f"  ({r.categories})" for r in pk.by_dtype]
    if pk.by_stage:
        lines.append("  alive at the peak by stage (record_function range at allocation):")
        lines += [f"  {format_bytes(r.bytes):>12}  {format_percent(100 * r.share):>6}  {r.name}"
                  f"  ({r.categories})" for r in pk.by_stage]
    lines += [f"  missing: {m}" for m in pk.missing]
    return lines
