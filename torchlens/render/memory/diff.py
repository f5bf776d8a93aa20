"""The report of a ``memdiff`` (memory result B against A): the verdict, peak, start
and end, both timelines on one axis, then what was alive at each peak by category
and by site, changed rows first.

Only draws: every figure is ``analysis.memory.diff``'s. Names from traces
(sites, functions) reach the page through the autoescaped table templates and
Bokeh ``@field`` hovers, which BokehJS shows as text.
"""

from __future__ import annotations

from typing import Any

from bokeh.models import HoverTool
from bokeh.plotting import figure
from markupsafe import Markup
from msgspec.structs import asdict

from torchlens.analysis.memory.categories import INFERRED
from torchlens.model import Profile
from torchlens.model.memory_figures import ChangeRow, FigureChange, MemoryDiff
from torchlens.model.units import format_bytes, format_percent
from torchlens.render import html, tables
from torchlens.render.findings import finding_html
from torchlens.render.legend import legend_below
from torchlens.render.memory.axis import memory_axis, memory_unit
from torchlens.render.page import section
from torchlens.render.tables import Column

MAX_ROWS = 100
ORDER = ("added", "removed", "grew", "shrank", "small", "same")
# A and B are not categories: neither takes a category's hue (render.memory.colours)
COLORS = {"a": "#444444", "b": "#D55E00"}

CHANGE = [Column("delta", "change", lambda v: format_bytes(v, signed=True)),
          Column("delta_pct", "change %", lambda v: format_percent(v, signed=True))]
ROWS = [Column("status", "status", str, False),
        Column("name", "name", str, False, tables.NAME_CHARS),
        Column("a_bytes", "alive at A's peak", format_bytes),
        Column("b_bytes", "alive at B's peak", format_bytes), *CHANGE,
        Column("categories", "categories", str, False, 60)]
FIGURES = [Column("figure", "allocated", str, False), Column("a", "A", format_bytes),
           Column("b", "B", format_bytes), *(
               Column(c.key.replace("delta_pct", "pct"), c.label, c.fmt) for c in CHANGE)]


def summary_line(profile: Profile, d: MemoryDiff) -> str:
    return f"memory diff: {d.verdict}"


def _ordered(rows: list[ChangeRow]) -> list[ChangeRow]:
    return [r for s in ORDER for r in rows if r.status == s]


def _figure_rows(d: MemoryDiff) -> list[tuple[str, FigureChange]]:
    return [(k, getattr(d.figures, k)) for k in ("peak", "start", "end")]


def text_report(profile: Profile, d: MemoryDiff) -> str:
    p = profile.payload
    lines = [summary_line(profile, d), f"A: {p.a}", f"B: {p.b}"]  # type: ignore[union-attr]
    for k, f in _figure_rows(d):
        lines.append(f"  {k:<6} {format_bytes(f.a):>12} -> "
                     f"{format_bytes(f.b):>12}  {format_bytes(f.delta, signed=True)}")
    for what, rows in (("categories", d.categories), ("sites", d.sites)):
        changed = [r for r in _ordered(rows) if r.status not in ("same", "small")]
        if changed:
            lines.append("alive at the peak by " + (
                f"category ({d.category_from or 'inferred from stacks'}):"
                if what == "categories" else "site:"))
        for r in changed[:10]:
            lines.append(f"  {r.status:<8} {tables.shorten(r.name, 60)}: "
                         f"{format_bytes(r.a_bytes)} -> {format_bytes(r.b_bytes)}")
    lines += [f"note: {n}" for n in d.notes]
    return "\n".join(lines)


def timelines_figure(d: MemoryDiff) -> Any:
    """Allocated memory of A and B over one x axis, each peak marked. The legend says
    only "A" and "B": two captures' descriptions often differ only at their end (the
    time taken), which a legend cuts; the text above the chart names each in full."""
    tls = d.timelines
    if not (tls.a or tls.b):
        return None
    unit, per = memory_unit(max((max(s.allocated, default=0)
                                 for s in (tls.a, tls.b) if s), default=0))
    p = figure(height=300, sizing_mode="stretch_width", x_axis_label=tls.x_label,
               title="Allocated memory, A and B on one axis",
               tools="xpan,xwheel_zoom,box_zoom,reset,save")
    for key, s in (("a", tls.a), ("b", tls.b)):
        if not s:
            continue
        y = [v / per for v in s.allocated]
        p.step(s.x, y, mode="after", color=COLORS[key], line_width=2,
               legend_label=key.upper())
        i = max(range(len(y)), key=y.__getitem__)
        dot = p.scatter([s.x[i]], [y[i]], size=11, marker="triangle", color=COLORS[key],
                        legend_label=f"{key.upper()}'s peak")
        p.add_tools(HoverTool(renderers=[dot], tooltips=[
            ("", f"{key.upper()}'s peak {format_bytes(s.allocated[i])}")]))
    memory_axis(p, unit, "allocated")
    legend_below(p)
    return p


def _table(rows: list[ChangeRow], what: str, columns: list[Column] = ROWS) -> Markup:
    ordered = _ordered(rows)
    parts = [tables.html_table(map(asdict, ordered[:MAX_ROWS]), columns)]
    if len(ordered) > MAX_ROWS:
        parts.append(html.note(f"{len(ordered) - MAX_ROWS:,} more {what}: "
                               f"MemoryDiffResult.{what}() or --json list them all"))
    return html.join(parts)


def report_parts(profile: Profile, d: MemoryDiff,
                 figures: list[Any]) -> tuple[str, list[Markup]]:
    """Summary line and sections of a memory diff report."""
    p = profile.payload
    th = d.thresholds
    words = [f"A: {p.a}", f"B: {p.b}",  # type: ignore[union-attr]
             f"Per category and site: same within {th.same_pct:g}% of A's bytes; small "
             f"beyond that but within {format_bytes(th.small_bytes)} "
             f"({format_percent(100 * th.small_share)} of the larger peak); grew and "
             "shrank exceed both."]
    out = [section("Verdict", html.join([finding_html(d.verdict),
                                         *(html.note(w) for w in words + d.notes)]),
                   "verdict"),
           section("Peak, start and end", tables.html_table(
               ({"figure": k, **asdict(f)} for k, f in _figure_rows(d)), FIGURES),
                   "figures")]
    fig = timelines_figure(d)
    if fig is not None:
        figures.append(fig)
        # each named in full, with its peak: two captures of one session can share
        # their description to the second
        peak = d.figures.peak
        out.append(section("Timelines", html.join([
            *(html.note(f"{k.upper()}: {name} (peak {format_bytes(v)})")
              for k, name, v in (("a", p.a, peak.a), ("b", p.b, peak.b))),  # type: ignore[union-attr]
            html.figure_slot(len(figures) - 1)]), "timelines"))
    if d.categories:
        out.append(section("Alive at the peak by category",
                           html.join([html.note(d.category_note or INFERRED),
                                      _table(d.categories, "categories", ROWS[:-1])]),
                           "categories"))
    if d.sites:
        out.append(section("Alive at the peak by site", _table(d.sites, "sites"), "sites"))
    return summary_line(profile, d), out
