"""The gpumem report's memory timeline: allocated memory stacked by category (inferred
from the allocating stacks, and said so), reserved memory, the peak, the biggest
allocations and an out-of-memory error at their places.

Draws only the analysis' figures: ``MemoryAnalysis.category_timeline`` (every
drawn stack adds up to the allocated line, the peak point kept exactly) or, with
no history to split, the plain timeline decimated. Category names reach the
chart as legend labels and hover labels, which BokehJS draws as text.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure
from bokeh.transform import stack

from torchlens.analysis.frames import frame_label
from torchlens.analysis.memory.analyze import MemoryAnalysis
from torchlens.analysis.memory.oom import OomDiagnosis
from torchlens.analysis.memory.timeline import biggest_allocations, decimate
from torchlens.model.snapshot import Frame
from torchlens.model.units import format_bytes, format_duration
from torchlens.render.glyphs import drop_copies
from torchlens.render.legend import legend_below
from torchlens.render.memory.axis import HOVER, memory_axis, memory_unit
from torchlens.render.memory.colours import colour_of, custom_names

MAX_POINTS = 4000  # timeline points per series after decimation (no categories)
MAX_MARKED = 12  # biggest allocations marked on the timeline
ALLOCATED = "#222222"  # the stack's top edge: the allocated line
RESERVED = "#666666"
PEAK = "#000000"
OOM = "#CC0000"
LEGEND_PER_ROW = 4  # legend entries per row under the chart


def _stack_text(frames: list[Frame], cells: dict[str, int] | None = None,
                n: int = 8) -> str:
    return " <- ".join(f"{f.name} ({frame_label(f, cells)})" for f in frames[:n])


def _stack(p: Any, names: list[str], levels: dict[str, list[int]], total: list[int],
           ms: list[float], cut: int, clock: str, custom: list[str],
           unit: tuple[str, int]) -> None:
    """The categories as stacked step areas (bottom first), faded from point ``cut`` on;
    an invisible line along the top carries the hover that names each category's bytes
    (in ``unit``: its name and bytes)."""
    name_of, per = unit
    # float32 halves the page (a 4,000-point stack of ten categories); 7 digits: MiB to
    # 0.01 at 50 GiB
    cols = {f"c{k}": (np.asarray(levels[n], dtype=np.float64) / per).astype(np.float32)
            for k, n in enumerate(names)}
    data = {"x": np.asarray(ms, dtype=np.float64), **cols}
    fields = list(cols)
    parts = [(slice(0, cut + 1), 0.9)]
    if cut < len(ms):
        parts.append((slice(cut, len(ms)), 0.3))
    for part, alpha in parts:
        src = ColumnDataSource({k: v[part] for k, v in data.items()})
        for k, name in enumerate(names):
            p.varea_step(x="x", y1=stack(*fields[:k]) if k else 0, y2=stack(*fields[:k + 1]),
                         step_mode="after", source=src, fill_color=colour_of(name, custom),
                         fill_alpha=alpha, legend_label=name)
    top = ColumnDataSource({**data, "total": (np.asarray(total, dtype=np.float64) / per)
                            .astype(np.float32)})
    line = p.line("x", "total", source=top, line_alpha=0.0)
    at = "@x{0,0.000} ms" if clock == "us" else "trace entry @x{0,0}"
    fmt = f"{HOVER[name_of]} {name_of}"
    tips = [("at", at), ("allocated", f"@total{fmt}")]
    # listed top of the stack first, as the areas lie on screen
    tips += [(name, f"@c{k}{fmt}") for k, name in reversed(list(enumerate(names)))]
    p.add_tools(HoverTool(renderers=[line], mode="vline", tooltips=tips))


def timeline_figure(a: MemoryAnalysis) -> Any:
    """Allocated (stacked by category when the trace has stacks to split it) and reserved
    memory over the cell or window (ms, or trace entries when the trace has no times),
    the peak and the biggest allocations marked."""
    tl = a.timeline
    if not tl.t_us:
        return None
    timed = tl.clock == "us"
    scale = 1000 if timed else 1
    s = a.category_timeline
    if s is not None:
        t, alloc, res = list(s.x), list(s.total), list(s.reserved)
    else:
        t, alloc, res = decimate(tl.t_us, tl.allocated, tl.reserved, max_points=MAX_POINTS)
        # the state at the start comes first, so a cell that begins by freeing starts high
        t, alloc, res = [0, *t], [tl.start_allocated, *alloc], [tl.start_reserved, *res]
    ms = [x / scale for x in t]
    events = len(tl.t_us) + 1
    title = f"Memory over {a.scope}"
    if s is not None:
        # the peak section's words for where the categories came from
        title += f" by category ({a.peak.category_from})"
    if len(t) < events:
        title += f": {len(tl.t_us):,} events, {len(t):,} points drawn"
    p = figure(height=340, sizing_mode="stretch_width",
               x_axis_label="ms since the first event" if timed else
               "trace entry (the snapshot records no times)",
               title=title, tools="xpan,xwheel_zoom,box_zoom,reset,save")
    d = a.diagnosis
    # A simulated OOM on a CPU capture: a GPU would have raised there, so the
    # model's reserved memory ends there and what the CPU went on to allocate is
    # drawn faded, not above a reserved line it could never have fit under.
    cut = len(ms)
    levels = {n: list(v) for n, v in s.bytes.items()} if s is not None else {}
    if d is not None and a.oom_x is not None and a.measured_on == "cpu":
        cut = next((i for i, x in enumerate(t) if x >= a.oom_x), len(t))
        if 0 < cut < len(t):
            # a point at the OOM holding the levels before it: the solid part ends there,
            # the faded part starts there
            ms.insert(cut, a.oom_x / scale)
            for series in (alloc, res, *levels.values()):
                series.insert(cut, series[cut - 1])
    custom = custom_names(a.peak.rules) if a.peak is not None else []
    unit = memory_unit(tl.peak_allocated)
    per = unit[1]
    if s is not None:
        _stack(p, s.names, levels, alloc, ms, cut, s.clock, custom, unit)
    p.step(ms[:cut + 1], [x / per for x in res[:cut + 1]], mode="after", color=RESERVED,
           line_width=1.5, line_dash="dashed", legend_label=f"reserved ({a.reserved_source})")
    p.step(ms[:cut + 1], [x / per for x in alloc[:cut + 1]], mode="after", color=ALLOCATED,
           line_width=1.5 if s is not None else 2, legend_label="allocated")
    if cut < len(ms):
        p.step(ms[cut:], [x / per for x in alloc[cut:]], mode="after", color=ALLOCATED,
               alpha=0.3, line_width=2, legend_label="allocated after the simulated OOM (on a GPU "
               "the cell would have raised)")
    if d is not None and a.oom_x is not None:
        _mark_oom(p, d, a.oom_x / scale, [ms[0], ms[-1]], per)
    if tl.start_inferred:
        p.line([ms[0], ms[-1]], [tl.start_allocated / per] * 2, color=ALLOCATED,
               line_dash="dotted", legend_label="alive at the start (inferred from frees)")
    _mark_biggest(p, a, scale, timed, per)
    _mark_peak(p, a, scale, per)
    memory_axis(p, unit[0])
    legend_below(p)
    legend = p.legend[0]
    legend.nrows = max(1, math.ceil(len(legend.items) / LEGEND_PER_ROW))
    legend.label_text_font_size = "9pt"
    legend.location = "center"  # under the plot, not off at its right edge
    drop_copies(p)  # nothing selects, the legend hides (16 models fewer)
    return p


def _mark_peak(p: Any, a: MemoryAnalysis, scale: int, per: int) -> None:
    pk = a.peak
    if pk is None or pk.entry is None:
        return
    top = pk.by_category[0].name if pk.by_category else ""
    psrc = ColumnDataSource({"x": [(pk.x or 0) / scale], "y": [pk.peak / per],
                             "what": [f"peak {format_bytes(pk.peak)}"
                                      + (f", most of it {top}" if top else "")]})
    pr = p.scatter("x", "y", source=psrc, size=14, marker="inverted_triangle", color=PEAK,
                   legend_label="peak (see Peak: what was alive)")
    p.add_tools(HoverTool(renderers=[pr], tooltips=[("", "@what")]))


def _mark_biggest(p: Any, a: MemoryAnalysis, scale: int, timed: bool, per: int) -> None:
    tl = a.timeline
    big = biggest_allocations(tl, MAX_MARKED)
    level = dict(zip(tl.t_us, tl.allocated, strict=True))
    src = ColumnDataSource({
        "x": [(b.t_alloc - tl.t0_us) / scale for b in big],
        "y": [level.get(b.t_alloc - tl.t0_us, 0) / per for b in big],
        "size": [format_bytes(b.size) for b in big], "site": [b.site for b in big],
        "stack": [_stack_text(b.frames, a.cells) for b in big],
        "freed": ["still alive at the end" if b.t_free is None else
                  f"freed after {format_duration(b.t_free - b.t_alloc)}" if timed else
                  f"freed {b.t_free - b.t_alloc:,} trace entries later" for b in big],
    })
    r = p.scatter("x", "y", source=src, size=9, fill_color="white", line_color=ALLOCATED,
                  line_width=1.5,
                  legend_label="biggest allocations")
    p.add_tools(HoverTool(renderers=[r], tooltips=[("size", "@size"), ("site", "@site"),
                                                    ("", "@freed"), ("stack", "@stack")]))


def _mark_oom(p: Any, d: OomDiagnosis, x: float, x_span: list[float], per: int) -> None:
    """The failing request at its place on the timeline, from the diagnosis' own figures:
    a bar from what was allocated to allocated + requested, and the card's capacity."""
    if d.capacity:
        p.line(x_span, [d.capacity / per] * 2, color=OOM, line_dash="dotted",
               legend_label=f"capacity {format_bytes(d.capacity)}")
    base = (d.allocated or 0) / per
    src = ColumnDataSource({"x": [x], "y0": [base], "y1": [base + (d.requested or 0) / per],
                            "what": [f"{d.cause}: {format_bytes(d.requested)} requested, "
                                     f"{format_bytes(d.shortfall)} short" if d.shortfall is not None
                                     else f"{d.cause}: {format_bytes(d.requested)} requested"],
                            "free": [f"{format_bytes(d.total_free)} free in total, "
                                     f"{format_bytes(d.usable_free)} usable"]})
    r = p.segment("x", "y0", "x", "y1", source=src, color=OOM, line_width=4,
                  legend_label=f"out of memory ({d.source})")
    p.add_tools(HoverTool(renderers=[r], tooltips=[("", "@what"), ("", "@free")]))
