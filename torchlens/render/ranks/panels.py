"""The panels of ``%ddp_check --profile``'s rank view: step time, memory,
fragmentation, largest free block, a joint timeline of the latest profiled
step, and the phase and role breakdowns, per rank; and the rows they take.

``render.ranks.view`` feeds them, live and for the static copy. Every number
comes from ``analysis.ranks.steps`` and ``analysis.ranks.arrivals``; this
module only converts units (bytes to MiB, fractions to %) and chooses what to
draw. Names from the traces (ops, lanes, collectives) reach the page as data:
BokehJS writes them as text in tooltips and on the canvas; the verdict
``Div`` is HTML, so it comes from an autoescaped template.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from bokeh.core.properties import value
from bokeh.layouts import column, row
from bokeh.models import (
    BoxAnnotation,
    ColumnDataSource,
    DataRange1d,
    Div,
    FactorRange,
    HoverTool,
    LabelSet,
    Range1d,
)
from bokeh.palettes import Category20_20
from bokeh.plotting import figure
from markupsafe import escape

from torchlens.analysis.ranks.slow import WINDOW
from torchlens.analysis.ranks.spread import SHOWN_RANKS
from torchlens.analysis.ranks.steps import PHASES, ROLES
from torchlens.model.findings import INFO, Finding
from torchlens.render.columns import as_mib, as_number, rank_color, to_columns
from torchlens.render.findings import finding_html
from torchlens.render.legend import add_colour_legend, legend_above
from torchlens.render.ranks.bands import SPREAD_MEM, band, spread_columns
from torchlens.render.ranks.lanes import (
    KIND_COLORS,
    Arrival,
    Box,
    Cell,
    EndMark,
    Lanes,
    Row,
    Timeline,
)
from torchlens.render.ranks.spans import span_marks
from torchlens.render.step_axis import CappedAxis
from torchlens.render.tables import shorten

#: the least time between two changes of the step chart's caption while the run goes on
CAPTION_EVERY_S = 5.0
COLLECTIVE_ALPHA = 0.45  # collectives are drawn translucent over the ops they overlap
OPS_BUDGET = 2000  # timeline ops drawn per profiled step, all ranks together
TIMELINE_ROWS = 3 * OPS_BUDGET  # about the last three profiled steps
COLLECTIVE_ROWS = 3000
ARRIVAL_ROWS = 1000
TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"

PARTS = (*PHASES, "other")
ROLE_COLORS = {"kernel": "#31a354", "memcpy": "#fd8d3c", "memset": "#bcbd22",
               "comm": "#d62728", "runtime": "#9467bd", "dataloader": "#8c564b",
               "cpu_exec": "#1f77b4", "other": "#c7c7c7"}
PART_COLORS = {"data": "#8c564b", "forward": "#1f77b4", "backward": "#ff7f0e",
               "optimizer": "#2ca02c", "collective": "#9467bd", "save": "#e377c2",
               "eval": "#17becf", "other": "#c7c7c7"}
#: a part's name on the charts: ``other`` is the step's time outside every timed
#: phase (a sleep, logging or I/O no timer saw), not a phase of its own
PART_NAMES = {"other": "between phases"}
STEP_KEYS = ("step", "step_ms", *(f"{p}_ms" for p in PARTS))
MEM_KEYS = ("step", "allocated", "reserved", "inactive", "rss", "frag", "free", "heap")
NAN = float("nan")
#: the memory panels' one line on a run with no CUDA allocator measured
NO_ALLOCATOR = ("CUDA allocator: not measured (no rank uses CUDA); the memory measured is "
                "drawn above: the resident set (RSS), and the C heap in use where the C "
                "library says it.")
NO_ALLOCATOR_MODELLED = ("CUDA allocator: not measured (no rank uses CUDA; its figures are "
                         "modelled at the profiled steps only, so they are not drawn); the "
                         "memory measured is drawn above: the resident set (RSS), and the C "
                         "heap in use where the C library says it.")
RESTART_COLOR = "#d62728"


def _cells(rows: Sequence[Mapping[str, Cell] | Row]) -> dict[str, list[Any]]:
    """Rows as a source's columns: the timeline's typed rows by their ``columns``."""
    return to_columns(r.columns() if isinstance(r, Box | Arrival | EndMark) else r for r in rows)


def stream(src: ColumnDataSource, rows: Sequence[Mapping[str, Cell] | Row],
           rollover: int) -> None:
    if rows:
        src.stream(_cells(rows), rollover=rollover)


def one_rank(items: list[Any]) -> list[list[Any]]:
    """One rank's ``items`` as the per-rank list analysis reads. The rows'
    ``rank`` is then 0: the view knows whose they are. (A list as long as the
    job, empty but for one rank, made every call cost the world size.)"""
    return [list(items)]


def profiled_points(color: str, rows: list[Mapping[str, Cell]]) -> list[dict[str, Cell]]:
    return [{"step": row["step"], "step_ms": row["step_ms"], "color": color}
            for row in rows if row["profiled"]]


#: the step chart's caption lists this many profiled steps in full, then the first and last
LIST_PROFILED = 6


def profiled_words(steps: list[int], every: int | None) -> str:
    """``Circles: profiled steps 4, 9 (then 1 in 48)``: the steps that were
    profiled (the first two come before the interval is chosen), then the interval."""
    then = f"then 1 in {every}" if every else ""
    if not steps:
        return "Circles: profiled steps (none yet" + (f"; {then}" if then else "") + ")"
    if len(steps) <= LIST_PROFILED:
        named, count = ", ".join(map(str, steps)), ""
    else:
        named = ", ".join(map(str, steps[:LIST_PROFILED - 2])) + f", …, {steps[-1]}"
        count = f"{len(steps)} steps"
    more = "; ".join(w for w in (count, then) if w)
    return f"Circles: profiled steps {named}" + (f" ({more})" if more else "")


def columns_or_empty(src: ColumnDataSource, rows: Sequence[Mapping[str, Cell] | Row]
                     ) -> dict[str, list[Any]]:
    return _cells(rows) if rows else {k: [] for k in src.data}


def mem_row(m: Mapping[str, Cell], heap: int | None = None) -> dict[str, Cell]:
    """A memory row in MiB and %; ``heap``: the step record's C heap in use (bytes)."""
    return {"step": m["step"], "allocated": as_mib(m.get("allocated")),
            "reserved": as_mib(m.get("reserved")), "inactive": as_mib(m.get("inactive_split")),
            "rss": as_mib(m.get("rss")),
            "frag": as_number(m.get("frag"), 100.0), "free": as_mib(m.get("largest_free")),
            "heap": as_mib(heap)}


def heap_of(rec: Any) -> int | None:
    """A step record's C heap in use (bytes), None where the C library did not say."""
    heap = rec.mem.heap if rec.mem is not None else None
    return heap if isinstance(heap, int) else None


def _stacked_bars(source: ColumnDataSource, parts: tuple[str, ...], colors: dict[str, str],
                  labels: list[str], x_label: str, title: str, number: str,
                  extra_tips: list[tuple[str, str]], names: dict[str, str] | None = None
                  ) -> Any:
    """One horizontal stacked bar per rank drawn, a ``<part>_ms`` column per part
    (``names``: a part's name in the legend and tooltip, where not its key)."""
    names = names or {}
    ranks = len(labels)
    fig = figure(height=max(190, 70 + 30 * ranks), sizing_mode="stretch_width", tools="save",
                 toolbar_location=None, y_range=FactorRange(*reversed(labels)),
                 x_axis_label=x_label, title=title)
    bars = fig.hbar_stack([f"{p}_ms" for p in parts], y="rank", height=0.7, source=source,
                          color=[colors[p] for p in parts],
                          legend_label=[names.get(p, p) for p in parts])
    for bar, p in zip(bars, parts, strict=True):
        fig.add_tools(HoverTool(renderers=[bar], tooltips=[
            ("", "@rank"), (names.get(p, p), f"@{p}_ms{{{number}}} ms"), *extra_tips]))
    fig.x_range.start = 0
    fig.ygrid.grid_line_color = None
    legend_above(fig)
    return fig


class Panels:
    """The figures and their (empty) sources.

    Markers of every rank share one source per panel (a colour column), lines
    have one source per rank: each renderer costs the kernel milliseconds to
    build, and an 8-rank view would otherwise take seconds.
    """

    def __init__(self, world_size: int, every: int, modelled: bool) -> None:
        self.world_size = world_size
        #: one line per slot; slot i draws rank ``shown[i]``. A job of more
        #: than SHOWN_RANKS ranks draws its spread across ranks as well.
        self.shown = list(range(min(world_size, SHOWN_RANKS)))
        self.spread = world_size > SHOWN_RANKS
        self.slot_of = {r: i for i, r in enumerate(self.shown)}  # rank -> its slot
        self.verdict = Div(text=str(verdict_html(None)), sizing_mode="stretch_width")
        self._step_panel(every)
        self._memory_panels(modelled)
        self._restart_marks()
        self._timeline_panel()
        self._breakdown_panel()
        self._roles_panel()
        # titles are short (a canvas title does not wrap: a 720 px frame cut the
        # long ones); what a chart needs said at length is in the caption under it
        self.alloc_row = row(self.frag_fig, self.free_fig, sizing_mode="stretch_width")
        self.set_memory_titles({"modelled"} if modelled else {"cuda"})
        self.layout = column(self.verdict, self.step_fig, self.step_note, self.mem_fig,
                             self.rss_fig, self.heap_fig, self.alloc_row, self.mem_note,
                             self.tl_fig,
                             self.tl_note, self.bd_fig,
                             self.roles_fig, self.roles_note, self.overlap_note,
                             sizing_mode="stretch_width")

    def _step_panel(self, every: int) -> None:
        n = len(self.shown)
        many = (f" The {n} ranks to look at of {self.world_size:,} (slowest, largest, "
                "stopped); grey: median and range of all.") if self.spread else ""
        step = figure(height=240, sizing_mode="stretch_width", tools=TOOLS,
                      title="Step time per rank (ms)", x_axis_label="step", y_axis_label="ms")
        self.every = every
        self._step_note_rest = "; ✖: where a rank stopped (hover for why)." + many
        self.step_note = caption(profiled_words([], every) + self._step_note_rest)
        self._profiled_words: str | None = None  # the caption's words not yet shown
        self._caption_at: float | None = None  # when they were last shown (monotonic)
        self.step_fig = step
        self.step_spread = ColumnDataSource(spread_columns(("step_ms",)))
        if self.spread:
            band(step, self.step_spread, "step_ms", f"all {self.world_size:,} ranks")
        self.steps = [ColumnDataSource({k: [] for k in STEP_KEYS}) for _ in range(n)]
        self.step_lines = [step.line("step", "step_ms", source=self.steps[i], color=self.color(r),
                                     line_width=1.5, legend_label=f"rank {r}")
                           for i, r in enumerate(self.shown)]
        self.spans, self.spans_legend = span_marks(step)
        self.profiled = ColumnDataSource({"step": [], "step_ms": [], "color": []})
        step.scatter("step", "step_ms", source=self.profiled, color="color", size=6,
                     fill_color="white")
        step.add_tools(HoverTool(renderers=self.step_lines, tooltips=[
            ("step", "@step"), ("step time", "@step_ms{0,0.0} ms"),
            *((PART_NAMES.get(p, p), f"@{p}_ms{{0,0.0}} ms") for p in PARTS)]))
        self.ended = ColumnDataSource({"step": [], "step_ms": [], "text": [], "label": [],
                                       "label_ms": [], "dy": []})
        ends = step.scatter("step", "step_ms", source=self.ended, marker="x", size=16,
                            line_width=3, color="#b00")
        step.add_tools(HoverTool(renderers=[ends], tooltips=[("", "@text")]))
        # ranks that stopped at one step (a failure takes its peers with it) stack
        # their labels; a short name left of the mark: a rank stops late in the
        # run, at the right edge, where a label on the right ran off the plot
        step.add_layout(LabelSet(x="step", y="label_ms", text="label", source=self.ended,
                                 x_offset=-10, y_offset="dy", text_font_size="9pt",
                                 text_color="#b00", text_align="right",
                                 text_baseline="middle"))
        # above, not beside: the panels that share the step axis keep one width
        step.legend.orientation = "horizontal"
        step.legend.label_text_font_size = "8pt"
        step.legend.margin = 0
        step.legend.padding = 2
        step.legend.click_policy = "hide"
        if len(self.shown) > 8:  # one row of 16 names is wider than the panel
            step.legend.nrows = 2
        step.add_layout(step.legend[0], "above")
        self.step_cap = CappedAxis(step)  # one spike does not flatten the other lines
        # a duration: from 0, so two lines 2 ms apart do not look twice as far apart as
        # they are (the run report's step chart does the same)
        step.y_range.start = 0

    def fit_step_axis(self) -> None:
        """The step chart's axis to a robust top, for the points its lines draw."""
        xs: list[float] = []
        ys: list[float] = []
        where: list[str] = []
        ranks: list[int] = []
        for r, src in zip(self.shown, self.steps, strict=False):
            xs += src.data["step"]
            ys += src.data["step_ms"]
            where += [f"step {s} (rank {r})" for s in src.data["step"]]
            ranks += [r] * len(src.data["step"])
        self.step_cap.update(xs, ys, where, ranks)

    def _restart_marks(self) -> None:
        """Where a restart's steps begin, on every panel drawn by step
        (``torchlens.watch`` of a job the elastic agent restarted)."""
        self.restarts = ColumnDataSource({"step": [], "text": []})
        for fig in (self.step_fig, self.mem_fig, self.rss_fig, self.heap_fig, self.frag_fig,
                    self.free_fig):
            fig.vspan(x="step", source=self.restarts, line_color=RESTART_COLOR, line_width=2,
                      line_dash="dashed")
        self.step_fig.add_layout(LabelSet(x="step", y=6, y_units="screen", text="text",
                                          source=self.restarts, x_offset=4,
                                          text_font_size="9pt", text_color=RESTART_COLOR))

    def _memory_panels(self, modelled: bool) -> None:
        n, x = len(self.shown), self.step_fig.x_range
        # the allocator's figures (KiB to GiB) and the resident set (hundreds of
        # MiB of interpreter and libraries) on one axis left the first flat on zero
        mem = figure(height=220, sizing_mode="stretch_width", tools=TOOLS, x_range=x,
                     x_axis_label="step", y_axis_label="MiB")
        rss = figure(height=180, sizing_mode="stretch_width", tools=TOOLS, x_range=x,
                     x_axis_label="step", y_axis_label="MiB (RSS)",
                     title="Resident memory (RSS) per rank (MiB), measured")
        # the C heap (glibc's bytes in use) falls when memory is freed, as RSS
        # seldom does (a C library that does not say it leaves the panel empty)
        heap = figure(height=180, sizing_mode="stretch_width", tools=TOOLS, x_range=x,
                      x_axis_label="step", y_axis_label="MiB (C heap)",
                      title="C heap in use per rank (MiB), measured",
                      # a fixed range until a rank's records carry the figure
                      # (``show_heap``): BokehJS cannot fit one over no finite value
                      y_range=Range1d(0, 1))
        self.heap_fig = heap
        frag = figure(height=200, sizing_mode="stretch_width", tools=TOOLS, x_range=x,
                      x_axis_label="step", y_axis_label="%")
        free = figure(height=200, sizing_mode="stretch_width", tools=TOOLS, x_range=x,
                      x_axis_label="step", y_axis_label="MiB")
        self.mem_fig, self.rss_fig, self.frag_fig, self.free_fig = mem, rss, frag, free
        for fig in (mem, frag, free):  # until a rank measured its CUDA allocator
            fig.visible = False
        self.mem = [ColumnDataSource({k: [] for k in MEM_KEYS}) for _ in range(n)]
        self.mem_prof = [ColumnDataSource({k: [] for k in MEM_KEYS}) for _ in range(n)]
        self.mem_marks = ColumnDataSource({k: [] for k in (*MEM_KEYS, "color")})
        self.prof_lines: list[Any] = []  # joined only when the profiled points are all there is
        rends: dict[Any, list[Any]] = {mem: [], rss: [], heap: [], frag: [], free: []}
        self.mem_spread = ColumnDataSource(spread_columns(SPREAD_MEM))
        self.prof_spread = ColumnDataSource(spread_columns(SPREAD_MEM))
        if self.spread:
            for fig, key in ((mem, "allocated"), (rss, "rss"), (frag, "frag"),
                             (free, "largest_free")):
                band(fig, self.mem_spread, key)
                self.prof_lines += band(fig, self.prof_spread, key, visible=modelled)
        self.slot_lines: list[list[Any]] = []  # slot -> its memory lines
        for i, r in enumerate(self.shown):
            c, ms, mp = self.color(r), self.mem[i], self.mem_prof[i]
            lines = [mem.line("step", "allocated", source=ms, color=c),
                     mem.line("step", "reserved", source=ms, color=c, line_dash="dashed")]
            rends[mem] += lines
            lines.append(rss.line("step", "rss", source=ms, color=c))
            rends[rss].append(lines[-1])
            lines.append(heap.line("step", "heap", source=ms, color=c))
            rends[heap].append(lines[-1])
            lines.append(frag.line("step", "frag", source=ms, color=c))
            rends[frag].append(lines[-1])
            prof = [fig.line("step", key, source=mp, color=c, line_dash=dash, visible=modelled)
                    for fig, key, dash in ((mem, "allocated", "solid"), (mem, "reserved", "dashed"),
                                           (frag, "frag", "solid"), (free, "free", "solid"))]
            self.prof_lines += prof
            self.slot_lines.append(lines + prof)
        for fig, key in ((mem, "allocated"), (mem, "reserved"), (frag, "frag"), (free, "free")):
            rends[fig].append(fig.scatter("step", key, source=self.mem_marks, color="color",
                                          size=5))
        for fig, tips in (
                (mem, [("allocated", "@allocated{0,0.000} MiB"),
                       ("reserved", "@reserved{0,0.000} MiB")]),
                (rss, [("RSS", "@rss{0,0.0} MiB")]),
                (heap, [("C heap in use", "@heap{0,0.0} MiB")]),
                (frag, [("inactive split / reserved", "@frag{0.0} %"),
                        ("inactive split", "@inactive{0,0.000} MiB of @reserved{0,0.000} MiB")]),
                (free, [("largest free block", "@free{0,0.000} MiB")])):
            fig.add_tools(HoverTool(renderers=rends[fig], tooltips=[("step", "@step"), *tips]))
            if fig is not rss and fig is not heap:  # far from zero: own range, own changes
                fig.y_range.start = 0
        self._heap_lines = rends[heap]
        self.mem_note = caption("")

    def show_heap(self) -> None:
        """Fit the C heap panel's range to the data, once a rank's records
        carry the figure."""
        if not isinstance(self.heap_fig.y_range, DataRange1d):
            self.heap_fig.y_range = DataRange1d(renderers=self._heap_lines)

    def _timeline_panel(self) -> None:
        self.lanes = Lanes(self.world_size)
        self.tl = Timeline(self.lanes, TIMELINE_ROWS, COLLECTIVE_ROWS, ARRIVAL_ROWS)
        tl = figure(height=190, sizing_mode="stretch_width", tools=TOOLS,
                    x_range=Range1d(0, 1), y_range=Range1d(0.5, -0.5),
                    x_axis_label="s since the run started",
                    title="Latest profiled step on every rank")
        self.tl_note = caption(
            "Ops by lane (nested ops stacked), red = collectives; black line = one collective "
            "across ranks at each rank's arrival (its NCCL kernel's start on the GPU where the "
            "step's trace has one, else its host's issue), ▼ = the rank that arrived last.")
        self.tl_fig = tl
        tl.ygrid.grid_line_color = None
        tl.yaxis.ticker = []
        tl.yaxis.major_label_text_font_size = "8pt"
        # the boxes behind the ranks' lanes, one per slot, made now: a model
        # added later, from a watch's thread, can meet the kernel serializing
        # the document ("Set changed size during iteration")
        self.groups = [BoxAnnotation(fill_color="#000", fill_alpha=0.04 if i % 2 else 0.0,
                                     line_alpha=0, visible=False, level="underlay",
                                     top=0.0, bottom=0.0)  # not the default: a Node model
                       for i in range(len(self.shown))]
        for box in self.groups:
            tl.add_layout(box)
        box_cols = ("left", "right", "top", "bottom", "color", "name", "ms", "rank", "lane",
                    "step")
        self.ops = ColumnDataSource({k: [] for k in (*box_cols, "kind")})
        self.colls = ColumnDataSource({k: [] for k in (*box_cols, "seq", "bytes")})
        self.arrivals = ColumnDataSource({k: [] for k in ("xs", "ys", "name", "seq", "step",
                                                           "last", "spread_ms", "arrived_by")})
        self.last = ColumnDataSource({k: [] for k in ("x", "y", "name", "seq", "step", "last",
                                                       "spread_ms", "arrived_by")})
        self.tl_ends = ColumnDataSource({k: [] for k in ("x", "y0", "y1", "text", "label")})
        add_colour_legend(tl, KIND_COLORS.items(), alpha={"collective": COLLECTIVE_ALPHA})
        ops = tl.quad("left", "right", "bottom", "top", source=self.ops, color="color",
                      line_alpha=0)
        colls = tl.quad("left", "right", "bottom", "top", source=self.colls, color="color",
                        fill_alpha=COLLECTIVE_ALPHA, line_color="#900")
        arr = tl.multi_line("xs", "ys", source=self.arrivals, color="#222", line_width=1.5)
        last = tl.scatter("x", "y", source=self.last, marker="inverted_triangle", size=11,
                          color="#222")
        # the rank's name, not its reason (in the hover): a reason ran over the lanes
        ends = tl.segment("x", "y0", "x", "y1", source=self.tl_ends, color="#b00",
                          line_width=3)
        tl.add_tools(HoverTool(renderers=[ends], tooltips=[("", "@text")]))
        tl.add_layout(LabelSet(x="x", y="y0", text="label", source=self.tl_ends, x_offset=4,
                               y_offset=-2, text_font_size="9pt", text_color="#b00",
                               text_baseline="top"))
        tl.add_tools(
            HoverTool(renderers=[ops], tooltips=[
                ("", "@name"), ("", "@kind, @ms{0,0.000} ms"), ("", "rank @rank, @lane"),
                ("step", "@step")]),
            HoverTool(renderers=[colls], tooltips=[
                ("", "@name #@seq"), ("", "@ms{0,0.000} ms @bytes"), ("", "rank @rank, @lane"),
                ("step", "@step")]),
            HoverTool(renderers=[arr, last], tooltips=[
                ("", "@name #@seq, step @step"), ("last", "@last"),
                ("spread", "@spread_ms{0,0.0} ms after the first"),
                ("arrival", "@arrived_by")]))

    def _roles_panel(self) -> None:
        """The profiled steps' breakdown with %%torchprof's definitions (one role per instant)."""
        labels = [f"rank {r}" for r in self.shown]
        n = len(labels)
        self.roles = ColumnDataSource({"rank": labels,
                                       "step_ms": [NAN] * n, "profiled": [0] * n,
                                       **{f"{role}_ms": [0.0] * n for role in ROLES}})
        self.roles_fig = _stacked_bars(
            self.roles, ROLES, ROLE_COLORS, labels, "ms (median of the profiled steps)",
            "%%torchprof roles of the profiled steps (median ms)", "0,0.00",
            [("step", "@step_ms{0,0.0} ms"), ("profiled steps", "@profiled")])

    def set_profiled_steps(self, steps: list[int], now: bool = False) -> None:
        """The step chart's caption names the steps profiled so far (sorted):
        at once the first time and when ``now`` (the run's end), else at most
        every ``CAPTION_EVERY_S``. A caption is page text: each change makes
        the browser lay the whole view out again (a Div's size is measured
        from the page), and one a flush kept a loaded browser busy for
        seconds at a time."""
        self._profiled_words = profiled_words(steps, self.every) + self._step_note_rest
        self.settle_captions(now or self._caption_at is None)

    def settle_captions(self, now: bool = True) -> None:
        """The caption's newest words, if any wait (``now``: whatever the time)."""
        words, at = self._profiled_words, time.monotonic()
        if words is None or not (now or at - (self._caption_at or 0.0) >= CAPTION_EVERY_S):
            return
        self.step_note.text, self._profiled_words, self._caption_at = words, None, at

    def _breakdown_panel(self) -> None:
        labels = [f"rank {r}" for r in self.shown]
        n = len(labels)
        self.breakdown = ColumnDataSource({"rank": labels,
                                           "median_step_ms": [NAN] * n,
                                           **{f"{p}_ms": [0.0] * n for p in PARTS}})
        self.roles_note = caption(
            "The profiled steps as %%torchprof breaks them down (the TensorBoard profiler "
            "plugin's definitions: one role per instant).")
        self.overlap_note = caption("")  # render.ranks.overlap's words, once steps are profiled
        self.bd_fig = _stacked_bars(
            self.breakdown, PARTS, PART_COLORS, labels, "ms (median per step)",
            f"Where each rank's step goes: median ms per phase (last {WINDOW} steps, as the "
            "verdict)", "0,0.0",
            [("median step", "@median_step_ms{0,0.0} ms")], PART_NAMES)

    def set_memory_titles(self, sources: set[str]) -> None:
        """Titles that say where the numbers come from (the sources seen so far).
        The allocator's panels are drawn only where a rank measured its CUDA
        allocator: a CPU run's allocator figures are modelled at the profiled
        steps alone, a few points that drawn by step read as a timeline of a
        CUDA allocator it never had; its measured memory (the resident set)
        is drawn, and one line says what the modelled figures are."""
        measured = "cuda" in sources
        for part in (self.mem_fig, self.frag_fig, self.free_fig, self.alloc_row):
            part.visible = measured
        if "cuda" in sources:
            self.mem_fig.title.text = "CUDA allocator per rank (MiB), measured"
            self.frag_fig.title.text = "Fragmentation (%)"
            self.free_fig.title.text = "Largest free block (MiB)"
            self.mem_note.text = (
                "Allocated solid, reserved dashed. Fragmentation: inactive split blocks / "
                "reserved (hover for the bytes). Largest free block: the profiled steps' "
                "allocator snapshots.")
        else:
            self.mem_fig.title.text = "Allocator: not measured"
            self.frag_fig.title.text = "Fragmentation: not measured"
            self.free_fig.title.text = "Largest free block: not measured"
            self.mem_note.text = NO_ALLOCATOR_MODELLED if "modelled" in sources \
                else NO_ALLOCATOR

    def relayout(self, ended: dict[int, str]) -> None:
        """Lane ticks, rank groups and height for the lanes known now."""
        lanes = self.lanes
        count = max(len(lanes.slot), 1)
        self.tl_fig.yaxis.ticker.ticks = list(range(len(lanes.slot)))  # not a new ticker
        self.tl_fig.yaxis.major_label_overrides = {
            y: shorten(f"rank {r}{' (ended)' if r in ended else ''} · {name}", 48)
            for (r, name), y in lanes.slot.items()}
        self.tl_fig.y_range.update(start=count - 0.5, end=-0.5, reset_start=count - 0.5,
                                   reset_end=-0.5)
        self.tl_fig.height = min(150 + 22 * count, 1000)  # 30 px: the colour legend
        ranks = sorted({r for r, _ in lanes.slot})
        for box, r in zip(self.groups, ranks, strict=False):
            top, bottom = lanes.group(r) or (0.0, 0.0)
            box.update(top=top, bottom=bottom, visible=True)
        for box in self.groups[len(ranks):]:
            box.visible = False

    def color(self, rank: int) -> str:
        """A rank's colour: its own among few ranks; its slot's among many,
        so the lines drawn never share one."""
        if not self.spread:
            return rank_color(rank)
        return Category20_20[self.slot_of.get(rank, 0) % 20]

    def show_ranks(self, shown: list[int]) -> None:
        """Slot i now draws rank ``shown[i]``: its colour, its legend entry and
        the bar charts' labels (the caller refills the slots' sources)."""
        self.shown = shown
        self.slot_of = {r: i for i, r in enumerate(shown)}
        labels = [f"rank {r}" for r in shown]
        items = {item.renderers[0]: item for item in self.step_fig.legend[0].items}
        for i, r in enumerate(shown):
            self.step_lines[i].glyph.line_color = self.color(r)
            if self.step_lines[i] in items:
                items[self.step_lines[i]].label = value(labels[i])
        for i, lines in enumerate(self.slot_lines):
            for line in lines:
                line.glyph.line_color = self.color(shown[i])
        for fig in (self.roles_fig, self.bd_fig):
            fig.y_range.factors = list(reversed(labels))


    def replace_timeline(self) -> None:
        """Every kept timeline row placed again (a new lane moved the lanes below it)."""
        tl = self.tl
        self.ops.data = columns_or_empty(self.ops, [tl.place_box(r, w) for r, w in tl.ops])
        self.colls.data = columns_or_empty(self.colls, [tl.place_box(r, w) for r, w in tl.colls])
        self.arrivals.data = columns_or_empty(
            self.arrivals, [tl.place_segment(r, w) for r, w in tl.arrivals])
        self.last.data = columns_or_empty(self.last, [tl.place_point(r, w) for r, w in tl.last])
        self.tl_ends.data = columns_or_empty(self.tl_ends,
                                             [tl.place_end(r, w) for r, w in tl.ends])


def caption(text: str) -> Div:
    """Words under a chart, wrapped to the frame (``text`` is plain: escaped)."""
    return Div(text=str(escape(text)), sizing_mode="stretch_width",
               styles={"font-size": "12px", "color": "#555", "margin-top": "0"})


def verdict_html(finding: Finding | None, color: str = "#333") -> Any:
    if finding is None:
        return finding_html(Finding(INFO, "Waiting for the ranks' first steps…"), color="#777")
    return finding_html(finding, color=color)


#: the ended marks' labels (9pt text, 12 px) one line apart when ranks stopped at one step
LABEL_LINE_PX = 15


def end_mark(drawn: dict[str, list[Any]], new: list[dict[str, Cell]], step: int, ms: float,
             text: str, rank: int) -> dict[str, Cell]:
    """``rank``'s ✖ at its last step point (``step``, ``ms``) as a row of
    ``Panels.ended``, after the marks ``drawn`` and ``new`` (this flush's).
    Ranks that stopped at one step (a failure takes its peers with it) each
    keep their ✖ at their own point, but their labels share the first one's
    height, a line apart downwards (above is the frame): at their own heights
    a few px apart, offsets alone left them drawn over each other."""
    earlier = [*zip(drawn["step"], drawn["label_ms"], strict=True),
               *((m["step"], m["label_ms"]) for m in new)]
    same = [y for s, y in earlier if s == step]
    return {"step": step, "step_ms": ms, "text": text, "label": f"rank {rank}",
            "label_ms": same[0] if same else ms, "dy": 4 - LABEL_LINE_PX * len(same)}
