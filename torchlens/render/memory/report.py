"""The ``gpumem`` report: summary, OOM diagnosis, memory timeline, sites, leaks, fragmentation.

Draws only a ``MemoryAnalysis`` (``analysis.memory``); computes nothing itself. Every string that
came from a trace (file names, function names, the error text) is escaped:
the HTML comes from autoescaped templates (``render.html``), and Bokeh hover
fields are plain ``@field`` references, which BokehJS shows as text. Big traces
are thinned (``render.memory.timeline``: kept points are exact, so peaks
survive) and the segment map draws at most ``MAX_SEGMENTS`` segments, saying so.
"""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, HoverTool, Range1d
from bokeh.plotting import figure
from markupsafe import Markup

from torchlens.analysis.memory import leaks
from torchlens.analysis.memory.analyze import MemoryAnalysis
from torchlens.analysis.memory.oom import OomDiagnosis
from torchlens.analysis.memory.peak import SEGMENTS_ONLY
from torchlens.model import Profile
from torchlens.model.units import (
    format_bytes,
    format_count,
    format_percent,
)
from torchlens.render import html, tables
from torchlens.render.findings import figure_text, finding_html, finding_text
from torchlens.render.glyphs import drop_copies
from torchlens.render.memory.peak import peak_html, peak_lines
from torchlens.render.memory.timeline import timeline_figure
from torchlens.render.page import section
from torchlens.render.tables import Column

MAX_SEGMENTS = 200  # segments drawn in the block map
SEGMENT_FRAME_PX = 100  # the block map's title, x axis and borders
SEGMENT_ROW_PX = 16  # and its height per segment (down to 3 px past 37 segments)
MIB = 1024 * 1024
# not the memory categories' hues (render.memory.colours): "allocated" is the timeline's
# dark allocated line, in flight the one hue no category takes
STATE_COLORS = {"active_allocated": "#444444", "inactive": "#cccccc",
                "active_pending_free": "#D55E00"}
STATE_NAMES = {"active_allocated": "allocated", "inactive": "cached free",
               "active_pending_free": "in flight (freed, stream still using it)"}


def summary_rows(a: MemoryAnalysis) -> list[tuple[str, str]]:
    """(label, value) pairs of the summary box, shared by the HTML and text views."""
    tl = a.timeline
    src = a.reserved_source
    rows = [
        ("peak allocated", format_bytes(tl.peak_allocated)),
        ("allocated at end", format_bytes(tl.end_allocated)),
        (f"change across {a.scope}", format_bytes(tl.end_allocated - tl.start_allocated)),
        (f"peak reserved ({src})", format_bytes(tl.peak_reserved)),
        (f"reserved at end ({src})", format_bytes(tl.end_reserved)),
        ("reserved change", format_bytes(tl.end_reserved - tl.start_reserved)),
        ("allocations / frees in the trace", f"{len(tl.allocations):,} / "
         f"{sum(1 for x in tl.allocations if x.t_free is not None):,}"),
    ]
    if tl.start_inferred:
        rows.insert(0, ("alive at the start (inferred from frees)", format_bytes(tl.start_allocated)))
    if a.steady_growth is not None:
        rows.append(("growth per run (after the first)", format_bytes(a.steady_growth)))
    return rows


def summary_line(profile: Profile, a: MemoryAnalysis) -> str:
    """One line for the text view and the report header."""
    error = profile.error
    tl = a.timeline
    parts = [f"peak {format_bytes(tl.peak_allocated)} allocated",
             f"end {format_bytes(tl.end_allocated)} ({format_bytes(tl.end_allocated - tl.start_allocated)} "
             f"across {a.scope})",
             f"reserved {format_bytes(tl.end_reserved)} ({a.reserved_source})"]
    run = a.model  # a CPU capture: the model stands in for reserved memory
    ooms = run.figures()["ooms"] if run is not None else 0
    if run is not None and ooms:
        # the model ran out of its capacity where the capture did not: its
        # reserved memory is below what the cell allocated, and says why
        parts[2] = (f"reserved {format_bytes(tl.end_reserved)} ({a.reserved_source}: "
                    f"{ooms} simulated OOM{'s' if ooms != 1 else ''} at "
                    f"{format_bytes(run.capacity or 0)}, where it held at most "
                    f"{format_bytes(run.figures()['peak_allocated'])} allocated)")
    if a.history_missing == SEGMENTS_ONLY:  # one moment: no peak, end or change to give
        parts[:2] = [f"{format_bytes(tl.end_allocated)} allocated when the snapshot was taken "
                     "(segments only, no allocation history: the peak was at least that)"]
    if tl.start_inferred:
        parts.insert(2, f"allocated counts {format_bytes(tl.start_allocated)} alive at the start "
                        "(inferred from frees)")
    if a.possible_leaks:
        parts.append(f"{len(a.possible_leaks)} possible leak site(s), first {a.possible_leaks[0].site}")
    if a.measured_on == "cpu":
        parts.append("CPU allocator")
    if error:
        parts.append(f"cell raised {error.get('type', 'an exception')}")
    return "torchlens gpumem: " + ", ".join(parts)


def _kv(rows: list[tuple[str, ...]], head: tuple[str, ...] | None = None) -> Markup:
    return html.render("kv.html.j2", rows=rows, head=head)


def diagnosis_rows(d: OomDiagnosis) -> list[tuple[str, str]]:
    """The OOM box's figures: the ones its finding's sentence is written from
    (in the units that sentence writes them)."""
    return [(fig.name, figure_text(fig)) for fig in d.finding.figures]


def diagnosis_html(d: OomDiagnosis) -> Markup:
    """The OOM box: the finding (cause, explanation, what to try) and its figures."""
    return html.render("oom.html.j2", d=d, finding=finding_html(d.finding, figures=False),
                       rows=diagnosis_rows(d))


def segment_map_figure(a: MemoryAnalysis) -> Any:
    """One row per segment, its blocks coloured by state (allocated / cached free / in flight)."""
    segs = a.segments
    if not segs:
        return None
    shown = segs[:MAX_SEGMENTS]
    cols: dict[str, list[Any]] = {k: [] for k in ("x", "y", "w", "color", "state", "size", "seg")}
    for row, seg in enumerate(shown):
        for b in seg.blocks:
            cols["x"].append((b.offset + b.size / 2) / MIB)
            cols["w"].append(b.size / MIB)
            cols["y"].append(row)
            cols["color"].append(STATE_COLORS.get(b.state, "#999999"))
            cols["state"].append(STATE_NAMES.get(b.state, b.state))
            cols["size"].append(format_bytes(b.size))
            cols["seg"].append(f"{seg.segment_type} segment of {format_bytes(seg.total_size)}"
                               f" at {seg.address:#x}")
    title = "Segments and blocks (dark allocated, light grey cached free, red-orange in flight)"
    if len(segs) > len(shown):
        title += f": first {len(shown)} of {len(segs)} segments by address"
    # The title and the x axis take about 80 px whatever the rows: the height is
    # that plus a band per row, so one segment still gets a visible row. The x axis
    # is the segments' own span (Bokeh's padded auto range began below 0 MiB).
    end = max(seg.total_size for seg in shown) / MIB
    p = figure(x_range=Range1d(0, end, bounds=(0, end)),height=min(700, SEGMENT_FRAME_PX + SEGMENT_ROW_PX * len(shown)),
               sizing_mode="stretch_width", x_axis_label="MiB from segment start", title=title,
               tools="xpan,xwheel_zoom,box_zoom,reset,save",
               y_range=(len(shown) - 0.5, -0.5))
    p.yaxis.visible = False
    r = p.rect("x", "y", "w", 0.8, source=ColumnDataSource(cols), fill_color="color",
               line_color="white", line_width=0.5)
    p.add_tools(HoverTool(renderers=[r], tooltips=[("block", "@size @state"), ("", "@seg")]))
    drop_copies(p)  # nothing selects, no legend
    return p


def _split_rows(f: Any) -> list[tuple[str, str]]:
    """inactive_split as torch defines it, measured where memory_stats gave it."""
    ours = f"{format_bytes(f.inactive_split)} in {f.inactive_split_blocks} blocks"
    label = ("inactive_split (free blocks in segments that also hold other blocks; "
             "expandable segments excluded, as torch does)")
    torch_value = f.torch_inactive_split
    if torch_value is None:
        rows = [(label, f"{ours}, from the segments")]
    elif torch_value == f.inactive_split:
        rows = [(label, f"{ours} (memory_stats inactive_split_bytes agrees)")]
    else:
        rows = [(label, f"{format_bytes(torch_value)} (memory_stats inactive_split_bytes); "
                        f"the snapshot's segments give {ours}")]
    if f.free_expandable:
        rows.append(("cached free in expandable segments (not inactive_split: free pages "
                     "can be unmapped)", format_bytes(f.free_expandable)))
    return rows


def fragmentation_rows(a: MemoryAnalysis) -> list[tuple[str, str]]:
    f = a.frag
    st = a.stats_after or (a.model.stats if a.model else {})
    # "allocated" is the timeline's figure everywhere; a CPU capture's model rounds to blocks
    modelled = a.model is not None and a.frag_snapshot is a.model.snapshot
    rows = [("reserved", format_bytes(f.reserved)),
            ("allocated", format_bytes(a.timeline.end_allocated if modelled else f.allocated)),
            *([("in the allocator model's blocks (the cell's own allocations, each request "
                "rounded up to a block)", format_bytes(f.allocated))] if modelled else []),
            ("cached free", f"{format_bytes(f.free_cached)} ({format_percent(100 * f.free_share)} of reserved)"),
            ("largest free block", f"{format_bytes(f.largest_free_block)} of {format_bytes(f.free_cached)} free"),
            ("in flight (pending free)", format_bytes(f.pending_free)),
            *_split_rows(f),
            ("segments", f"{f.n_segments} ({f.n_segments_by_pool['small']} small, "
                         f"{f.n_segments_by_pool['large']} large)")]
    if a.unusable_for_largest is not None:
        biggest, share = a.unusable_for_largest
        rows.append((f"free but unusable for the largest request ({format_bytes(biggest)})",
                     f"{format_percent(100 * share)} of reserved"))
    for key, label in (("num_alloc_retries", "alloc retries"), ("num_ooms", "OOMs")):
        if key in st:
            rows.append((label, f"{st[key]:,}"))
    return rows


_SITE_COLS = [Column("site", "site", numeric=False), Column("function", "function", numeric=False),
              Column("bytes", "bytes allocated", format_bytes), Column("count", "allocations", format_count),
              Column("largest", "largest", format_bytes), Column("alive_bytes", "alive at end", format_bytes)]
_LEAK_COLS = [Column("flag", "possible leak", numeric=False), Column("site", "site", numeric=False),
              Column("function", "function", numeric=False), Column("bytes", "bytes alive", format_bytes),
              Column("count", "tensors", format_count), Column("passes", "passes", format_count)]
_GROWTH_COLS = [Column("run", "run", format_count), Column("end_allocated", "allocated at end", format_bytes),
                Column("growth", "growth", format_bytes)]


def sections(a: MemoryAnalysis, top: int, figures: list[Any]) -> list[tuple[str, Markup, str]]:
    """(title, body, anchor) of every section; Bokeh figures go to ``figures``."""
    out = []
    if a.diagnosis is not None:
        out.append(("Out-of-memory diagnosis", diagnosis_html(a.diagnosis), "oom"))
    body = _kv(summary_rows(a)) + html.join([html.note(n) for n in a.notes])
    out.append(("Summary", body, "summary"))
    if a.comparison:
        rows = comparison_cells(a)
        what = "this machine's allocator" if a.measured_on == "cpu" else "what happened"
        out.append(("Allocator model: what if", _kv(rows, head=("", what, "simulated")),
                    "simulate"))
    if a.peak is not None:
        out.append(("Peak: what was alive", peak_html(a.peak, a.timeline.clock, a.cells, top),
                    "peak"))
    for title, fig, anchor in (("Memory timeline", timeline_figure(a), "timeline"),):
        out.append((title, _fig(fig, figures, "no allocations recorded"), anchor))
    sites = a.sites[:top]
    out.append(("Top allocation sites", tables.html_table([vars(s) for s in sites], _SITE_COLS)
                if sites else html.note(a.sites_missing[:1].upper() + a.sites_missing[1:] + "."
                                        if a.sites_missing else "No allocations."), "sites"))
    leak_rows = [dict(vars(r), flag="yes" if r.flagged else "") for r in a.survivors[:top]]
    out.append((f"Still alive at the end of {a.scope} (possible leaks)",
                html.render("leaks.html.j2", table=tables.html_table(leak_rows, _LEAK_COLS)
                            if leak_rows else None, scope=a.scope,
                            rule=leaks.FLAG_RULE[a.measured_on == "snapshot"]), "leaks"))
    if a.growth:
        out.append(("Growth per run (--repeat)",
                    tables.html_table([vars(g) for g in a.growth], _GROWTH_COLS), "growth"))
    if not a.segments_measured:
        out.append(("Fragmentation", html.note(
            "Not measured: this allocator backend keeps no segments to read "
            "(see Not measured)."), "fragmentation"))
        return out
    src = ("the allocator model replaying this cell's allocations (not a GPU)"
           if a.reserved_source == "allocator model" else "the snapshot")
    frag = html.note(f"From {src}.") + _kv(fragmentation_rows(a))
    frag += _fig(segment_map_figure(a), figures, "no segments")
    out.append(("Fragmentation", frag, "fragmentation"))
    return out


def comparison_cells(a: MemoryAnalysis) -> list[tuple[str, str, str]]:
    """(figure, real, simulated) of the what-if comparison, as text: the one
    formatting of it that the HTML, the text view and ``torchlens simulate`` show."""
    def cell(v: int | None, is_bytes: bool) -> str:
        return "n/a" if v is None else format_bytes(v) if is_bytes else f"{v:,}"

    return [(label, cell(r, b), cell(s, b)) for label, r, s, b in a.comparison]


def comparison_lines(a: MemoryAnalysis) -> list[str]:
    """The comparison as fixed-width lines (text view, ``torchlens simulate``)."""
    return [f"  {label:<18} real {r:>12}   simulated {s:>12}"
            for label, r, s in comparison_cells(a)]


def _fig(fig: Any, figures: list[Any], empty: str) -> Markup:
    if fig is None:
        return html.note(empty)
    figures.append(fig)
    return html.figure_slot(len(figures) - 1)


def text_report(profile: Profile, a: MemoryAnalysis) -> str:
    """The text/plain view: summary, diagnosis, top sites and possible leaks."""
    top = profile.payload.top  # type: ignore[union-attr]
    lines = [summary_line(profile, a)]
    d = a.diagnosis
    if d is not None:
        lines += ["", finding_text(d.finding)]
    if a.peak is not None:
        lines += ["", *peak_lines(a.peak, a.timeline.clock, top)]
    lines += ["", "top allocation sites:" if a.sites or not a.sites_missing
              else f"top allocation sites: none, {a.sites_missing}"]
    lines += [f"  {format_bytes(s.bytes):>12}  {s.count:>6}x  {s.site}  {s.function}"
              for s in a.sites[:top]]
    if a.possible_leaks:
        lines += ["", "possible leaks (still alive, left behind on several passes):"]
        lines += [f"  {format_bytes(r.bytes):>12}  {r.count:>6} tensors  {r.site}  {r.function}"
                  for r in a.possible_leaks[:top]]
    lines += comparison_lines(a)
    lines += [f"not measured: {u}" for u in profile.unmeasured]
    return "\n".join(lines)


def report_parts(profile: Profile, a: MemoryAnalysis,
                 figures: list[Any]) -> tuple[str, list[Markup]]:
    """Summary line and sections of a gpumem report."""
    top = profile.payload.top  # type: ignore[union-attr]
    return summary_line(profile, a), [section(t, body, anchor)
                                      for t, body, anchor in sections(a, top, figures)]
