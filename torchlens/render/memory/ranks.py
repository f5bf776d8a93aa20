"""The report of a ``memranks`` result (a folder of per-rank snapshots): the imbalance
first, every rank's timeline on one chart, then the per-rank table.

Only draws ``analysis.memory.ranks``'s figures. Names from snapshots (sites,
file names) go through the autoescaped table templates and Bokeh ``@field``
hovers, which BokehJS shows as text.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bokeh.models import ColumnDataSource, HoverTool
from bokeh.palettes import Category10_10, Turbo256
from bokeh.plotting import figure
from markupsafe import Markup

from torchlens.analysis.memory.categories import INFERRED
from torchlens.model import Profile
from torchlens.model.memory_figures import MemoryRanks, RankPeak
from torchlens.model.units import format_bytes, format_duration
from torchlens.render import html, tables
from torchlens.render.findings import finding_html
from torchlens.render.legend import legend_below
from torchlens.render.memory.axis import HOVER, memory_axis, memory_unit
from torchlens.render.page import section
from torchlens.render.tables import Column


def summary_line(profile: Profile, d: MemoryRanks) -> str:
    return f"memory of {len(d.ranks)} ranks: {d.verdict}"


def when_text(r: RankPeak) -> str:
    """When a rank peaked, in its snapshot's units."""
    if r.entry is None:
        return "at the start" if r.peak else "not known"
    if r.clock == "us":
        return f"{format_duration(r.x or 0)} after its first event"
    return f"trace entry {r.entry:,}"


@dataclass
class _Line:
    """One rank as the table and the text show it."""

    rank: int
    peak: int
    above: float
    when: str
    category: str
    site: str
    end: int
    source: str


def _rows(d: MemoryRanks) -> list[_Line]:
    return [_Line(r.rank, r.peak,
                  # a result saved before ``above`` was kept: against the median
                  r.above if r.above is not None else r.peak - d.median_peak,
                  when_text(r), r.top_category.name if r.top_category else "",
                  r.top_site.name if r.top_site else "", r.end, r.source) for r in d.ranks]


def _columns(d: MemoryRanks) -> list[Column]:
    """The table's columns; the comparison's says what each peak is set against."""
    vs = Column("above", f"vs {d.compared_with}", lambda v: format_bytes(v, signed=True))
    return [COLUMNS[0], COLUMNS[1], vs, *COLUMNS[2:]]


COLUMNS = [Column("rank", "rank", str), Column("peak", "peak allocated", format_bytes),
           Column("when", "when", str, False),
           Column("category", "largest category at the peak", str, False),
           Column("site", "largest site at the peak", str, False, tables.NAME_CHARS),
           Column("end", "allocated at end", format_bytes),
           Column("source", "file", str, False, 60)]


def text_report(profile: Profile, d: MemoryRanks) -> str:
    lines = [summary_line(profile, d)]
    for r in _rows(d):
        lines.append(f"  rank {r.rank:>4}  {format_bytes(r.peak):>12}  "
                     f"{format_bytes(r.above, signed=True):>12}  {r.when}  "
                     f"{r.category} at {r.site}")
    lines += [f"note: {n}" for n in d.notes]
    return "\n".join(lines)


def _colour(i: int, n: int) -> str:
    return Category10_10[i % 10] if n <= 10 else Turbo256[int(i * 255 / max(n - 1, 1))]


def timelines_figure(d: MemoryRanks) -> Any:
    """Every rank's allocated memory on one axis, each peak marked."""
    tls = d.timelines
    series = {k: v for k, v in tls.series.items() if v}
    if not series:
        return None
    im = d.imbalance
    unit, scale = memory_unit(max((max(s.allocated, default=0) for s in series.values()),
                                  default=0))
    p = figure(height=340, sizing_mode="stretch_width", x_axis_label=tls.x_label,
               title="Allocated memory of every rank"
               + (f" ({tls.left_out} ranks with lower peaks not drawn)"
                  if tls.left_out else ""),
               tools="xpan,xwheel_zoom,box_zoom,reset,save")
    for i, (rank, s) in enumerate(series.items()):
        standout = im is not None and str(im.rank) == rank
        y = [v / scale for v in s.allocated]
        line = p.step("x", "y", source=ColumnDataSource({
            "x": s.x, "y": y, "rank": [f"rank {rank}"] * len(y)}), mode="after",
            color=_colour(i, len(series)), line_width=3 if standout else 1.5,
            alpha=1.0 if standout or len(series) <= 10 else 0.6,
            legend_label=f"rank {rank}" if len(series) <= 16 else "ranks")
        p.add_tools(HoverTool(renderers=[line], tooltips=[("", "@rank"),
                                                          ("allocated", f"@y{HOVER[unit]} {unit}")]))
    memory_axis(p, unit, "allocated")
    legend_below(p)
    return p


def report_parts(profile: Profile, d: MemoryRanks,
                 figures: list[Any]) -> tuple[str, list[Markup]]:
    """Summary line and sections of a per-rank memory report."""
    p = profile.payload
    th = d.thresholds
    pair = d.compared_with == "the other rank"
    ref = "the other rank" if pair else "the median"
    words = [f"Folder: {p.root}",  # type: ignore[union-attr]
             f"A rank stands out when its peak is more than {th.same_pct:g}% above "
             f"{ref} and more than {100 * th.small_share:g}% of its peak. What it holds "
             f"more of: per category and site, its bytes at its peak less "
             f"{ref if pair else 'the median other rank'}'s. " + INFERRED]
    out = [section("Imbalance", html.join([finding_html(d.verdict),
                                           *(html.note(w) for w in words + d.notes)]),
                   "imbalance")]
    fig = timelines_figure(d)
    if fig is not None:
        figures.append(fig)
        out.append(section("Timelines", html.figure_slot(len(figures) - 1), "timelines"))
    out.append(section("Per rank", tables.html_table(map(asdict, _rows(d)), _columns(d)), "ranks"))
    return summary_line(profile, d), out
