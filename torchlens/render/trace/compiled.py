"""The ``torch.compile`` section of a ``%%torchprof`` report: its findings, what
compiling cost, and the time of each compiled region.

Draws ``analysis.trace.compiled.CompiledCode``; computes nothing itself.
"""

from __future__ import annotations

from markupsafe import Markup

from torchlens.analysis.trace.compiled import CompiledCode
from torchlens.model.units import format_duration, plural
from torchlens.render import html
from torchlens.render.findings import finding_text, findings_html
from torchlens.render.tables import Column, html_table

REGION_COLUMNS = [
    Column("compile_id", "region (frame/compile)", numeric=False),
    Column("function", "function", numeric=False),
    Column("where", "where", numeric=False),
    Column("calls", "calls", lambda v: f"{int(v):,}"),
    Column("total_us", "total", format_duration),
    Column("mean_us", "per call", format_duration),
]


def figures_words(c: CompiledCode) -> list[str]:
    """What compiling cost and how the time split, each with where it came from."""
    out = []
    if c.compiles or c.graphs:
        wall = f" of the cell's {format_duration(c.wall_s * 1e6)}" if c.wall_s else ""
        out.append(f"{plural(c.compiles, 'compile')} took {format_duration(c.compile_s * 1e6)}"
                   f"{wall}; {plural(c.graphs, 'graph')} made; "
                   f"{plural(len(c.breaks), 'graph-break reason')}, "
                   f"{plural(len(c.recompiles), 'recompile')} (from {c.recorded})")
    if c.lost:
        out.append("some compiles may be missing: torch keeps its last 64 compile records "
                   "and every one was made in this cell; the figures above count those kept")
    if c.regions:
        out.append(f"{format_duration(c.region_us)} inside compiled regions, "
                   f"{format_duration(c.eager_us)} eager between the first and the last "
                   f"(measured: {c.measured}; a region's time includes the compiles "
                   "dynamo ran inside it)")
    return out


def compiled_section(c: CompiledCode) -> Markup:
    """Findings, the figures' sentence, and the regions table."""
    parts = [findings_html(c.findings, "No graph break, recompile or failed compile.")]
    parts += [html.note(w) for w in figures_words(c)]
    if c.regions:
        rows = [{"compile_id": r.compile_id, "function": r.function or "(not recorded)",
                 "where": r.where, "calls": r.calls, "total_us": r.total_us,
                 "mean_us": r.total_us / r.calls if r.calls else None} for r in c.regions]
        parts.append(html_table(rows, REGION_COLUMNS))
    return html.join(parts)


def compiled_text(c: CompiledCode) -> list[str]:
    """The same, as text lines."""
    lines = ["torch.compile:"]
    lines += [f"  {finding_text(f)}" for f in c.findings]
    lines += [f"  {w}" for w in figures_words(c)]
    for r in c.regions:
        where = f" ({r.where})" if r.where else ""
        lines.append(f"  region {r.compile_id} {r.function or '(not recorded)'}{where}: "
                     f"{plural(r.calls, 'call')}, {format_duration(r.total_us)}")
    return lines
