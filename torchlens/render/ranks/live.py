"""The figures of ``%ddp_check --profile``: step time, memory, fragmentation, a
joint timeline of the latest profiled step and the phase breakdown, per rank.

Drawn live while the ranks run (``RankProfileView``: a Bokeh layout in a
``jupyter_bokeh.BokehModel`` whose sources grow with ``stream(rows,
rollover)``, so only new rows travel to the browser) and again from the run's
kept records (``rank_profile_figures``) for the static copy the notebook keeps
and the HTML report. The static copy is the live view fed everything at once,
so the two cannot drift apart.

Every number comes from ``analysis.rank_steps`` and ``analysis.rank_arrivals``;
this module only converts units (bytes to MiB, fractions to %) and chooses
what to draw: the timeline keeps each summary's longest ops and a bounded
number of rows, so a long run does not slow the browser down. Names from the
traces (ops, lanes, collectives) reach the page as data: BokehJS writes them
as text in tooltips and on the canvas; the verdict ``Div`` is HTML, so it
comes from an autoescaped template.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

from bokeh.core.properties import value
from bokeh.layouts import column, row
from bokeh.models import (
    BoxAnnotation,
    ColumnDataSource,
    Div,
    FactorRange,
    HoverTool,
    LabelSet,
    Range1d,
)
from bokeh.palettes import Category20_20
from bokeh.plotting import figure

from torchlens.analysis.ranks.arrivals import collective_arrivals
from torchlens.analysis.ranks.slow import slow_rank
from torchlens.analysis.ranks.spread import SHOWN_RANKS, Spread, ranks_to_show
from torchlens.analysis.ranks.steps import (
    PHASES,
    ROLES,
    memory_rows,
    profiled_breakdown,
    rank_table,
    step_rows,
)
from torchlens.model.findings import INFO, Finding
from torchlens.model.payloads import RankProfiling
from torchlens.model.units import plural
from torchlens.render.ddp.heartbeats import FLUSH_S, _color, _columns, _mib, _num
from torchlens.render.findings import finding_html
from torchlens.render.ranks.bands import (
    SPREAD_MEM,
    band,
    mem_spread_units,
    merge,
    spread_columns,
)
from torchlens.render.ranks.lanes import LEVELS, Lanes, Timeline
from torchlens.render.tables import shorten

STEP_ROLLOVER = 5000  # points per rank in the step and memory panels
SPREAD_STEPS = 256  # steps whose band a late rank still moves (analysis.rank_spread.Spread)
OPS_BUDGET = 2000  # timeline ops drawn per profiled step, all ranks together
TIMELINE_ROWS = 3 * OPS_BUDGET  # about the last three profiled steps
COLLECTIVE_ROWS = 3000
ARRIVAL_ROWS = 1000
WAITING_STEPS = 3  # profiled steps held back until every rank sent its summary
VERDICT_S = 1.0  # the verdict and breakdown are recomputed at most this often
KEEP_SUMMARIES = 50  # per rank, as RankProfiling.keep
REASON_CHARS = 80
TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"

PARTS = (*PHASES, "other")
ROLE_COLORS = {"kernel": "#31a354", "memcpy": "#fd8d3c", "memset": "#bcbd22",
               "comm": "#d62728", "runtime": "#9467bd", "dataloader": "#8c564b",
               "cpu_exec": "#1f77b4", "other": "#c7c7c7"}
PART_COLORS = {"data": "#8c564b", "forward": "#1f77b4", "backward": "#ff7f0e",
               "optimizer": "#2ca02c", "collective": "#9467bd", "other": "#c7c7c7"}
KIND_COLORS = {"op": "#6baed6", "kernel": "#31a354", "memcpy": "#fd8d3c",
               "memset": "#bcbd22", "collective": "#d62728"}
STEP_KEYS = ("step", "step_ms", *(f"{p}_ms" for p in PARTS))
MEM_KEYS = ("step", "allocated", "reserved", "rss", "frag", "free")
NAN = float("nan")


RESTART_COLOR = "#d62728"
#: one label above the other when ranks stopped at the same step
LABEL_STEP_PX = 13


def _stream(src: ColumnDataSource, rows: list[dict[str, Any]], rollover: int) -> None:
    if rows:
        src.stream(_columns(rows), rollover=rollover)


def _one(items: list[Any]) -> list[list[Any]]:
    """One rank's ``items`` as the per-rank list analysis reads. The rows'
    ``rank`` is then 0: the view knows whose they are. (A list as long as the
    job, empty but for one rank, made every call cost the world size.)"""
    return [list(items)]


def _stacked_bars(source: ColumnDataSource, parts: tuple[str, ...], colors: dict[str, str],
                  labels: list[str], x_label: str, title: str, number: str,
                  extra_tips: list[tuple[str, str]]) -> Any:
    """One horizontal stacked bar per rank drawn, a ``<part>_ms`` column per part."""
    ranks = len(labels)
    fig = figure(height=max(190, 70 + 30 * ranks), sizing_mode="stretch_width", tools="save",
                 toolbar_location=None, y_range=FactorRange(*reversed(labels)),
                 x_axis_label=x_label, title=title)
    bars = fig.hbar_stack([f"{p}_ms" for p in parts], y="rank", height=0.7, source=source,
                          color=[colors[p] for p in parts], legend_label=list(parts))
    for bar, p in zip(bars, parts, strict=True):
        fig.add_tools(HoverTool(renderers=[bar], tooltips=[
            ("", "@rank"), (p, f"@{p}_ms{{{number}}} ms"), *extra_tips]))
    fig.x_range.start = 0
    fig.ygrid.grid_line_color = None
    fig.legend.label_text_font_size = "8pt"
    fig.legend.spacing = 0
    fig.legend.padding = 4
    fig.add_layout(fig.legend[0], "right")
    return fig


class _Panels:
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
        self.verdict = Div(text=str(_verdict_html(None)), sizing_mode="stretch_width")
        self._step_panel(every)
        self._memory_panels(modelled)
        self._restart_marks()
        self._timeline_panel()
        self._breakdown_panel()
        self._roles_panel()
        self.layout = column(self.verdict, self.step_fig, self.mem_fig,
                             row(self.frag_fig, self.free_fig, sizing_mode="stretch_width"),
                             self.tl_fig, self.bd_fig, self.roles_fig,
                             sizing_mode="stretch_width")

    def _step_panel(self, every: int) -> None:
        n = len(self.shown)
        many = (f"; the {n} ranks to look at of {self.world_size:,} (slowest, largest, stopped), "
                "grey: median and range of all") if self.spread else ""
        step = figure(height=240, sizing_mode="stretch_width", tools=TOOLS,
                      title="Step time per rank (ms); circles: profiled steps"
                            + (f" (1 in {every})" if every else "") + many,
                      x_axis_label="step", y_axis_label="ms")
        self.step_fig = step
        self.step_spread = ColumnDataSource(spread_columns(("step_ms",)))
        if self.spread:
            band(step, self.step_spread, "step_ms", f"all {self.world_size:,} ranks")
        self.steps = [ColumnDataSource({k: [] for k in STEP_KEYS}) for _ in range(n)]
        self.step_lines = [step.line("step", "step_ms", source=self.steps[i], color=self.color(r),
                                     line_width=1.5, legend_label=f"rank {r}")
                           for i, r in enumerate(self.shown)]
        self.profiled = ColumnDataSource({"step": [], "step_ms": [], "color": []})
        step.scatter("step", "step_ms", source=self.profiled, color="color", size=6,
                     fill_color="white")
        step.add_tools(HoverTool(renderers=self.step_lines, tooltips=[
            ("step", "@step"), ("step time", "@step_ms{0,0.0} ms"),
            *((p, f"@{p}_ms{{0,0.0}} ms") for p in PARTS)]))
        self.ended = ColumnDataSource({"step": [], "step_ms": [], "text": [], "dy": []})
        ends = step.scatter("step", "step_ms", source=self.ended, marker="x", size=16,
                            line_width=3, color="#b00")
        step.add_tools(HoverTool(renderers=[ends], tooltips=[("", "@text")]))
        # ranks that stopped at one step (a failure takes its peers with it) stack their labels
        step.add_layout(LabelSet(x="step", y="step_ms", text="text", source=self.ended,
                                 x_offset=8, y_offset="dy", text_font_size="9pt",
                                 text_color="#b00"))
        # above, not beside: the panels that share the step axis keep one width
        step.legend.orientation = "horizontal"
        step.legend.label_text_font_size = "8pt"
        step.legend.margin = 0
        step.legend.padding = 2
        step.legend.click_policy = "hide"
        if len(self.shown) > 8:  # one row of 16 names is wider than the panel
            step.legend.nrows = 2
        step.add_layout(step.legend[0], "above")

    def _restart_marks(self) -> None:
        """Where a restart's steps begin, on every panel drawn by step
        (``torchlens.watch`` of a job the elastic agent restarted)."""
        self.restarts = ColumnDataSource({"step": [], "text": []})
        for fig in (self.step_fig, self.mem_fig, self.frag_fig, self.free_fig):
            fig.vspan(x="step", source=self.restarts, line_color=RESTART_COLOR, line_width=2,
                      line_dash="dashed")
        self.step_fig.add_layout(LabelSet(x="step", y=6, y_units="screen", text="text",
                                          source=self.restarts, x_offset=4,
                                          text_font_size="9pt", text_color=RESTART_COLOR))

    def _memory_panels(self, modelled: bool) -> None:
        n, x = len(self.shown), self.step_fig.x_range
        mem = figure(height=220, sizing_mode="stretch_width", tools=TOOLS, x_range=x,
                     x_axis_label="step", y_axis_label="MiB")
        frag = figure(height=200, sizing_mode="stretch_width", tools=TOOLS, x_range=x,
                      x_axis_label="step", y_axis_label="%")
        free = figure(height=200, sizing_mode="stretch_width", tools=TOOLS, x_range=x,
                      x_axis_label="step", y_axis_label="MiB")
        self.mem_fig, self.frag_fig, self.free_fig = mem, frag, free
        self.mem = [ColumnDataSource({k: [] for k in MEM_KEYS}) for _ in range(n)]
        self.mem_prof = [ColumnDataSource({k: [] for k in MEM_KEYS}) for _ in range(n)]
        self.mem_marks = ColumnDataSource({k: [] for k in (*MEM_KEYS, "color")})
        self.prof_lines: list[Any] = []  # joined only when the profiled points are all there is
        rends: dict[Any, list[Any]] = {mem: [], frag: [], free: []}
        self.mem_spread = ColumnDataSource(spread_columns(SPREAD_MEM))
        self.prof_spread = ColumnDataSource(spread_columns(SPREAD_MEM))
        if self.spread:
            for fig, key in ((mem, "allocated"), (mem, "rss"), (frag, "frag"),
                             (free, "largest_free")):
                band(fig, self.mem_spread, key)
                self.prof_lines += band(fig, self.prof_spread, key, visible=modelled)
        self.slot_lines: list[list[Any]] = []  # slot -> its memory lines
        for i, r in enumerate(self.shown):
            c, ms, mp = self.color(r), self.mem[i], self.mem_prof[i]
            lines = [mem.line("step", "allocated", source=ms, color=c),
                     mem.line("step", "reserved", source=ms, color=c, line_dash="dashed"),
                     mem.line("step", "rss", source=ms, color=c, line_dash="dotted")]
            rends[mem] += lines
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
                (mem, [("allocated", "@allocated{0,0.0} MiB"),
                       ("reserved", "@reserved{0,0.0} MiB"), ("RSS", "@rss{0,0.0} MiB")]),
                (frag, [("inactive split / reserved", "@frag{0.0} %")]),
                (free, [("largest free block", "@free{0,0.0} MiB")])):
            fig.add_tools(HoverTool(renderers=rends[fig], tooltips=[("step", "@step"), *tips]))
            fig.y_range.start = 0
        self.set_memory_titles({"modelled"} if modelled else {"cuda"})

    def _timeline_panel(self) -> None:
        self.lanes = Lanes(self.world_size)
        self.tl = Timeline(self.lanes, TIMELINE_ROWS, COLLECTIVE_ROWS, ARRIVAL_ROWS)
        tl = figure(height=160, sizing_mode="stretch_width", tools=TOOLS,
                    x_range=Range1d(0, 1), y_range=Range1d(0.5, -0.5),
                    x_axis_label="s since the run started",
                    title="Latest profiled step on every rank: ops by lane (nested ops "
                          "stacked), red = collectives; black line = one collective across "
                          "ranks, ▼ = the rank that arrived last")
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
                                                           "last", "spread_ms")})
        self.last = ColumnDataSource({k: [] for k in ("x", "y", "name", "seq", "step", "last",
                                                       "spread_ms")})
        self.tl_ends = ColumnDataSource({k: [] for k in ("x", "y0", "y1", "text")})
        ops = tl.quad("left", "right", "bottom", "top", source=self.ops, color="color",
                      line_alpha=0)
        colls = tl.quad("left", "right", "bottom", "top", source=self.colls, color="color",
                        fill_alpha=0.45, line_color="#900")
        arr = tl.multi_line("xs", "ys", source=self.arrivals, color="#222", line_width=1.5)
        last = tl.scatter("x", "y", source=self.last, marker="inverted_triangle", size=11,
                          color="#222")
        tl.segment("x", "y0", "x", "y1", source=self.tl_ends, color="#b00", line_width=3)
        tl.add_layout(LabelSet(x="x", y="y0", text="text", source=self.tl_ends, x_offset=4,
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
                ("spread", "@spread_ms{0,0.0} ms after the first")]))

    def _roles_panel(self) -> None:
        """The profiled steps' breakdown with %%torchprof's definitions (one role per instant)."""
        labels = [f"rank {r}" for r in self.shown]
        n = len(labels)
        self.roles = ColumnDataSource({"rank": labels,
                                       "step_ms": [NAN] * n, "profiled": [0] * n,
                                       **{f"{role}_ms": [0.0] * n for role in ROLES}})
        self.roles_fig = _stacked_bars(
            self.roles, ROLES, ROLE_COLORS, labels, "ms (median of the profiled steps)",
            "Profiled steps as %%torchprof breaks them down (TensorBoard profiler plugin's "
            "definitions): median ms per role", "0,0.00",
            [("step", "@step_ms{0,0.0} ms"), ("profiled steps", "@profiled")])

    def _breakdown_panel(self) -> None:
        labels = [f"rank {r}" for r in self.shown]
        n = len(labels)
        self.breakdown = ColumnDataSource({"rank": labels,
                                           "median_step_ms": [NAN] * n,
                                           **{f"{p}_ms": [0.0] * n for p in PARTS}})
        self.bd_fig = _stacked_bars(
            self.breakdown, PARTS, PART_COLORS, labels, "ms (median per step)",
            "Where each rank's step goes: median ms per phase", "0,0.0",
            [("median step", "@median_step_ms{0,0.0} ms")])

    def set_memory_titles(self, sources: set[str]) -> None:
        """Titles that say where the numbers come from (the sources seen so far)."""
        if "cuda" in sources:
            self.mem_fig.title.text = ("CUDA memory per rank (MiB): allocated solid, reserved "
                                       "dashed")
            self.frag_fig.title.text = "Fragmentation: inactive split / reserved (%)"
            self.free_fig.title.text = "Largest free block (MiB, profiled steps' snapshots)"
        elif "modelled" in sources:
            self.mem_fig.title.text = (
                "CPU run, modelled: what a CUDA caching allocator would hold per rank (MiB) "
                "at profiled steps: allocated solid, reserved dashed; RSS dotted")
            self.frag_fig.title.text = "Fragmentation, modelled: inactive split / reserved (%)"
            self.free_fig.title.text = "Largest free block, modelled (MiB)"
        else:
            self.mem_fig.title.text = "RSS per rank (MiB)"
            self.frag_fig.title.text = "Fragmentation: not measured (no allocator figures)"
            self.free_fig.title.text = "Largest free block: not measured"

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
        self.tl_fig.height = min(120 + 22 * count, 1000)
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
            return _color(rank)
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


def _verdict_html(sr: Any, color: str = "#333") -> Any:
    if sr is None:
        return finding_html(Finding(INFO, "Waiting for the ranks' first steps…"), color="#777")
    return finding_html(sr.finding, color=color)


class RankProfileView:
    """The live view: ``push_*`` records as the kernel decodes them, ``flush``
    from the same thread (at least twice a second while records arrive).

    ``t0``: the run's start (unix seconds) that timeline times are relative
    to; without it, the first record's start. ``modelled``: the memory
    figures will come from the allocator model (a CPU run), so the titles say
    so before the first summary arrives.
    """

    def __init__(self, world_size: int, every: int, modelled: bool,
                 t0: float | None = None) -> None:
        self.world_size = world_size
        self.every = every
        self.t0 = t0
        self.panels = _Panels(world_size, every, modelled)
        self.layout = self.panels.layout
        self._widget: Any = None
        self.flushes = 0
        #: every record pushed, per rank (the analysis reads whole runs)
        self.records: list[list[dict[str, Any]]] = [[] for _ in range(world_size)]
        self.summaries: list[deque[dict[str, Any]]] = [deque(maxlen=KEEP_SUMMARIES)
                                                       for _ in range(world_size)]
        self.ended: dict[int, str] = {}
        self._new_steps: list[list[dict[str, Any]]] = [[] for _ in range(world_size)]
        self._new_summaries: list[tuple[int, dict[str, Any]]] = []
        self._new_ended: list[tuple[int, str, float]] = []
        self._new_restarts: list[dict[str, Any]] = []
        self._waiting: dict[int, dict[int, dict[str, Any]]] = {}  # step -> rank -> summary
        self._last_point: dict[int, tuple[int, float]] = {}
        self._mem_sources: set[str] = set()
        self._latest: tuple[int, float, float] | None = None  # step, start, end shown
        self._dirty = False
        self._last_flush = 0.0
        self._last_analysis = -math.inf
        self._analysis_every = VERDICT_S
        self._table: list[dict[str, Any]] = []  # the last analysis' rank_table
        self._ranked = False  # the slots were picked from a rank_table
        self._slow: int | None = None
        self.step_spread = Spread(("step_ms",), keep=SPREAD_STEPS)
        self.mem_spread = Spread(SPREAD_MEM, keep=SPREAD_STEPS)
        self.prof_spread = Spread(SPREAD_MEM, keep=SPREAD_STEPS)

    @property
    def widget(self) -> Any:
        """The ``BokehModel`` that shows ``layout`` in a notebook (made on first use)."""
        if self._widget is None:
            from jupyter_bokeh import BokehModel

            self._widget = BokehModel(self.layout)
        return self._widget

    def hide_timeline(self) -> None:
        """Drop the profiled-step timeline: for summaries cut to their figures
        (``torchlens run``'s live feed has no ops to draw)."""
        self.panels.tl_fig.visible = False

    def push_steps(self, rank: int, records: list[dict[str, Any]]) -> None:
        """A batch of step records of ``rank`` (docs/RANK_PROFILE.md)."""
        if not records:
            return
        if self.t0 is None:
            self.t0 = float(records[0]["t0"])
        self.records[rank].extend(records)
        self._new_steps[rank].extend(records)
        self._dirty = True

    def push_summary(self, rank: int, summary: dict[str, Any]) -> None:
        """One profiled-step summary of ``rank``."""
        if self.t0 is None:
            self.t0 = float(summary["t0"])
        self.summaries[rank].append(summary)
        self._new_summaries.append((rank, summary))
        self._dirty = True

    def mark_restart(self, step: int, text: str) -> None:
        """The job restarted: its next start's steps are drawn from ``step``."""
        self._new_restarts.append({"step": step, "text": text})

    def rank_ended(self, rank: int, reason: str, t: float) -> None:
        """``rank`` stopped early (crash, kill) at unix time ``t``, for ``reason``."""
        self.ended[rank] = reason
        self._new_ended.append((rank, reason, t))

    def flush(self, force: bool = False) -> None:
        """Stream what arrived since the last flush; at most every ``FLUSH_S``
        unless ``force`` (the run's end: held-back collectives are drawn too)."""
        now = time.monotonic()
        analysis_due = self._dirty and (force or now - self._last_analysis >= self._analysis_every)
        pending = (any(self._new_steps) or self._new_summaries or self._new_ended
                   or self._new_restarts or analysis_due or (force and self._waiting))
        if not pending or (not force and now - self._last_flush < FLUSH_S):
            return
        self._last_flush = now
        self._flush_steps()
        restarts, self._new_restarts = self._new_restarts, []
        _stream(self.panels.restarts, restarts, STEP_ROLLOVER)
        if any(r not in self.panels.slot_of for r, _, _ in self._new_ended):
            self._pick()  # a rank that stopped early is drawn before its end is marked
        self._flush_ended()
        self._flush_summaries(force)
        if analysis_due:
            self._analyse()
        self.flushes += 1

    # ---- one flush -----------------------------------------------------------------

    def _flush_steps(self) -> None:
        p = self.panels
        seen = set(self._mem_sources)
        for r, new in enumerate(self._new_steps):
            if not new:
                continue
            rows = step_rows(_one(new))
            mem = memory_rows(_one(new), [[]])
            seen.update(m.get("source") for m in mem)
            new.clear()
            if rows:
                self._last_point[r] = (rows[-1]["step"], rows[-1]["step_ms"])
                if rows[-1].get("window"):
                    p.step_fig.xaxis.axis_label = "window"
            if p.spread:
                self.step_spread.add(r, rows)
                self.mem_spread.add(r, mem)
            slot = self.panels.slot_of.get(r)
            if slot is None:
                continue
            _stream(p.steps[slot], [{k: row[k] for k in STEP_KEYS} for row in rows],
                    STEP_ROLLOVER)
            _stream(p.profiled, _profiled_points(p.color(r), rows), STEP_ROLLOVER * len(p.shown))
            _stream(p.mem[slot], [_mem_row(m) for m in mem], STEP_ROLLOVER)
        if p.spread:
            merge(p.step_spread, self.step_spread.changed(), STEP_ROLLOVER)
            merge(p.mem_spread, mem_spread_units(self.mem_spread.changed()), STEP_ROLLOVER)
        self._set_memory_sources(seen)

    def _point_at(self, rank: int, t: float) -> tuple[int, float]:
        """The step point ``rank`` had drawn when it stopped at ``t``: its last
        step ended by then. Not simply its latest point: a replayed feed, or
        a restarted rank, has drawn steps after it."""
        for rec in reversed(self.records[rank]):
            if isinstance(rec.get("t1"), (int, float)) and rec["t1"] <= t:
                (row,) = step_rows(_one([rec]))
                return row["step"], row["step_ms"]
        return self._last_point.get(rank, (0, 0.0))

    def _flush_ended(self) -> None:
        p = self.panels
        steps, ends = [], []
        at = list(p.ended.data["step"])
        for rank, reason, t in self._new_ended:
            if rank not in self.panels.slot_of:  # one of many: the checklist names it
                continue
            step, ms = self._point_at(rank, t)
            text = f"rank {rank}: {shorten(reason, REASON_CHARS)}"
            dy = 4 - LABEL_STEP_PX * at.count(step)  # downwards: above is the frame
            at.append(step)
            steps.append({"step": step, "step_ms": ms, "text": text, "dy": dy})
            row = p.tl.place_end({"x": t - (self.t0 or t), "text": text}, rank)
            p.tl.ends.append((row, rank))
            ends.append(row)
        if self._new_ended and p.lanes.slot:
            p.relayout(self.ended)
        self._new_ended.clear()
        _stream(p.ended, steps, STEP_ROLLOVER)
        _stream(p.tl_ends, ends, STEP_ROLLOVER)

    def _flush_summaries(self, force: bool) -> None:
        p = self.panels
        new, self._new_summaries = self._new_summaries, []
        moved = added = False
        for rank, s in sorted(new, key=lambda x: (x[0], x[1]["step"])):
            if rank not in self.panels.slot_of:
                continue
            a, m = p.lanes.add(rank, _lane_names(s))
            added, moved = added or a, moved or m
        if added:
            p.relayout(self.ended)
            if moved:  # rows already drawn sit on the old lanes: send them all again
                self._replace_timeline()
            elif p.tl.ends:  # an ended rank's mark spans its lanes
                p.tl_ends.data = _columns([p.tl.place_end(r, w) for r, w in p.tl.ends])
        ops, colls, seen = [], [], set(self._mem_sources)
        for rank, s in new:
            mem = memory_rows([[]], _one([s]))
            seen.update(m.get("source") for m in mem)
            if p.spread:
                self.prof_spread.add(rank, mem)
            slot = self.panels.slot_of.get(rank)
            if slot is None:
                continue
            ops += self._op_rows(rank, s)
            colls += self._collective_rows(rank, s)
            self._waiting.setdefault(int(s["step"]), {})[rank] = s
            self._show_step(s)
            rows = [_mem_row(m) for m in mem]
            _stream(p.mem_prof[slot], rows, STEP_ROLLOVER)
            _stream(p.mem_marks, [{**m, "color": p.color(rank)} for m in rows],
                    STEP_ROLLOVER * len(p.shown))
        if p.spread:
            merge(p.prof_spread, mem_spread_units(self.prof_spread.changed()), STEP_ROLLOVER)
        self._set_memory_sources(seen)
        _stream(p.ops, ops, TIMELINE_ROWS)
        _stream(p.colls, colls, COLLECTIVE_ROWS)
        self._flush_arrivals(force)

    def _flush_arrivals(self, force: bool) -> None:
        """Join each collective across ranks once every running rank has sent the step."""
        p = self.panels
        segs, marks = [], []
        running = [r for r in p.shown if r not in self.ended]
        for step in sorted(self._waiting):
            got = self._waiting[step]
            if not (force or len(self._waiting) > WAITING_STEPS
                    or all(r in got for r in running)):
                break
            del self._waiting[step]
            for a in collective_arrivals(got):
                if len(a["ranks"]) < 2:
                    continue
                lanes = [(r, self._lane_name(got[r], lane))
                         for r, lane in zip(a["ranks"], a["lanes"], strict=True)]
                info = {"name": a["name"], "seq": a["seq"], "step": step,
                        "last": f"rank {a['last_rank']}", "spread_ms": a["spread_ms"]}
                seg = p.tl.place_segment({"xs": [t - self.t0 for t in a["t0"]], **info}, lanes)
                i = a["ranks"].index(a["last_rank"])
                mark = p.tl.place_point({"x": a["last_t0"] - self.t0, **info}, lanes[i])
                p.tl.arrivals.append((seg, lanes))
                p.tl.last.append((mark, lanes[i]))
                segs.append(seg)
                marks.append(mark)
        _stream(p.arrivals, segs, ARRIVAL_ROWS)
        _stream(p.last, marks, ARRIVAL_ROWS)

    def _analyse(self) -> None:
        """The verdict and the breakdown, from every record so far."""
        p = self.panels
        started = time.monotonic()
        sr = slow_rank(self.records, window=20)
        self._slow = sr.rank
        self._table = rank_table(self.records, [list(s) for s in self.summaries])
        self._pick()
        color = p.color(sr.rank) if sr.rank is not None else "#333"
        p.verdict.text = str(_verdict_html(sr, color))
        for r, line in zip(p.shown, p.step_lines, strict=True):
            line.glyph.line_width = 3.0 if r == sr.rank else 1.5
        table = [self._table[r] for r in p.shown]
        data: dict[str, list[Any]] = {"rank": [f"rank {row['rank']}" for row in table],
                                      "median_step_ms": [_num(row.get("step_ms"))
                                                         for row in table]}
        for part in PARTS:
            data[f"{part}_ms"] = [row.get(f"{part}_ms") or 0.0 for row in table]
        p.breakdown.data = data
        by_rank = {row["rank"]: row for row in profiled_breakdown(
            [list(s) for s in self.summaries])}
        roles = [by_rank[r] for r in p.shown]
        p.roles.data = {"rank": [f"rank {row['rank']}" for row in roles],
                        "step_ms": [_num(row["step_ms"]) for row in roles],
                        "profiled": [row["profiled"] for row in roles],
                        **{f"{role}_ms": [row[f"{role}_ms"] or 0.0 for row in roles]
                           for role in ROLES}}
        self._dirty = False
        self._last_analysis = time.monotonic()
        # a long run makes the analysis slower: keep it a small share of the kernel's time
        self._analysis_every = max(VERDICT_S, 10 * (self._last_analysis - started))

    def _pick(self) -> None:
        """A job of many ranks: which ranks get a line (the slow rank and the
        ranks that stopped early first), and their slots refilled."""
        p = self.panels
        if not p.spread:
            return
        stopped = [r for r, why in self.ended.items() if why != "finished"]  # in end order
        first = ([self._slow] if self._slow is not None else []) + stopped
        table = self._table or [{"rank": r} for r in range(self.world_size)]
        # before the first analysis the slots hold ranks 0.. for want of better: not kept
        current = p.shown if self._ranked else []
        self._ranked = self._ranked or bool(self._table)
        shown = ranks_to_show(table, first, current, len(p.shown))
        if shown != p.shown:
            self._show(shown)

    def _show(self, shown: list[int]) -> None:
        p, old = self.panels, list(self.panels.shown)
        p.show_ranks(shown)
        points, marks = [], []
        for i, r in enumerate(shown):
            rows = step_rows(_one(self.records[r]))
            prof = [_mem_row(m) for m in memory_rows([[]], _one(self.summaries[r]))]
            points += _profiled_points(p.color(r), rows)
            marks += [{**m, "color": p.color(r)} for m in prof]
            if old[i] == r:
                continue
            p.steps[i].data = _columns_or_empty(p.steps[i], [{k: row[k] for k in STEP_KEYS}
                                                             for row in rows[-STEP_ROLLOVER:]])
            mem = memory_rows(_one(self.records[r]), [[]])[-STEP_ROLLOVER:]
            p.mem[i].data = _columns_or_empty(p.mem[i], [_mem_row(m) for m in mem])
            p.mem_prof[i].data = _columns_or_empty(p.mem_prof[i], prof)
        p.profiled.data = _columns_or_empty(p.profiled, points[-STEP_ROLLOVER * len(shown):])
        p.mem_marks.data = _columns_or_empty(p.mem_marks, marks)
        # the timeline keeps the lanes of the ranks drawn
        kept = set(shown)
        self._waiting = {step: got for step, got in (
            (step, {r: s for r, s in got.items() if r in kept}) for step, got in
            self._waiting.items()) if got}
        tl = p.tl
        tl.ops = deque(((r, w) for r, w in tl.ops if w[0] in kept), maxlen=tl.ops.maxlen)
        tl.colls = deque(((r, w) for r, w in tl.colls if w[0] in kept), maxlen=tl.colls.maxlen)
        tl.arrivals = deque(((r, w) for r, w in tl.arrivals
                             if all(k[0] in kept for k in w)), maxlen=tl.arrivals.maxlen)
        tl.last = deque(((r, w) for r, w in tl.last if w[0] in kept), maxlen=tl.last.maxlen)
        tl.ends = [(r, w) for r, w in tl.ends if w in kept]
        if p.lanes.keep(kept):
            p.relayout(self.ended)
            self._replace_timeline()

    # ---- helpers ----------------------------------------------------------------------

    def _set_memory_sources(self, seen: set[Any]) -> None:
        seen.discard(None)
        if seen != self._mem_sources:
            self._mem_sources = seen
            self.panels.set_memory_titles(seen)
            # the profiled points are joined when they are the only allocator figures
            joined = "modelled" in seen and "cuda" not in seen
            for line in self.panels.prof_lines:
                line.visible = joined

    @staticmethod
    def _lane_name(summary: dict[str, Any], index: Any) -> str:
        """The name of lane ``index``; the first lane for an index the summary lacks."""
        lanes = _lane_names(summary)
        i = int(index or 0)
        return lanes[i] if 0 <= i < len(lanes) else lanes[0]

    def _op_rows(self, rank: int, s: dict[str, Any]) -> list[dict[str, Any]]:
        """The summary's longest ops (the timeline's share of this rank), placed."""
        budget = max(50, OPS_BUDGET // len(self.panels.shown))
        ops = sorted(s.get("ops") or [], key=lambda o: -(o.get("dur") or 0.0))[:budget]
        out = []
        for o in ops:
            lane = self._lane_name(s, o.get("lane"))
            kind = str(o.get("kind") or "op")
            level = min(int(o.get("depth") or 0), LEVELS - 1) if kind == "op" else None
            left = float(o["t0"]) - self.t0
            row = {"left": left, "right": left + float(o.get("dur") or 0.0),
                   "color": KIND_COLORS.get(kind, "#999"), "name": str(o.get("name", "")),
                   "ms": _num(o.get("dur"), 1e3), "rank": rank, "lane": lane,
                   "step": int(s["step"]), "kind": kind}
            where = (rank, lane, level)
            self.panels.tl.ops.append((row, where))
            out.append(self.panels.tl.place_box(row, where))
        return out

    def _collective_rows(self, rank: int, s: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for c in s.get("collectives") or []:
            lane = self._lane_name(s, c.get("lane"))
            left = float(c["t0"]) - self.t0
            size = c.get("bytes")
            row = {"left": left, "right": left + float(c.get("dur") or 0.0),
                   "color": KIND_COLORS["collective"], "name": str(c.get("name", "")),
                   "ms": _num(c.get("dur"), 1e3), "rank": rank, "lane": lane,
                   "step": int(s["step"]), "seq": c.get("seq"),
                   "bytes": "" if size is None else plural(int(size), "byte")}
            where = (rank, lane, None)
            self.panels.tl.colls.append((row, where))
            out.append(self.panels.tl.place_box(row, where))
        return out

    def _show_step(self, s: dict[str, Any]) -> None:
        """Keep the timeline on the newest profiled step (every rank's copy of it)."""
        step, start, end = int(s["step"]), float(s["t0"]) - self.t0, float(s["t1"]) - self.t0
        if self._latest is not None and step < self._latest[0]:
            return
        if self._latest is not None and step == self._latest[0]:
            start, end = min(start, self._latest[1]), max(end, self._latest[2])
        self._latest = (step, start, end)
        pad = (end - start) * 0.03 or 0.001
        self.panels.tl_fig.x_range.update(start=start - pad, end=end + pad,
                                          reset_start=start - pad, reset_end=end + pad)

    def _replace_timeline(self) -> None:
        p, tl = self.panels, self.panels.tl
        p.ops.data = _columns_or_empty(p.ops, [tl.place_box(r, w) for r, w in tl.ops])
        p.colls.data = _columns_or_empty(p.colls, [tl.place_box(r, w) for r, w in tl.colls])
        p.arrivals.data = _columns_or_empty(
            p.arrivals, [tl.place_segment(r, w) for r, w in tl.arrivals])
        p.last.data = _columns_or_empty(p.last, [tl.place_point(r, w) for r, w in tl.last])
        p.tl_ends.data = _columns_or_empty(p.tl_ends, [tl.place_end(r, w) for r, w in tl.ends])


def _profiled_points(color: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"step": row["step"], "step_ms": row["step_ms"], "color": color}
            for row in rows if row["profiled"]]


def _lane_names(summary: dict[str, Any]) -> list[str]:
    return [str(n) for n in summary.get("lanes") or []] or ["lane 0"]


def _columns_or_empty(src: ColumnDataSource, rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return _columns(rows) if rows else {k: [] for k in src.data}


def _mem_row(m: dict[str, Any]) -> dict[str, Any]:
    return {"step": m["step"], "allocated": _mib(m.get("allocated")),
            "reserved": _mib(m.get("reserved")), "rss": _mib(m.get("rss")),
            "frag": _num(m.get("frag"), 100.0), "free": _mib(m.get("largest_free"))}


def rank_profile_figures(profiling: RankProfiling, world_size: int, t0: float | None,
                         ended: dict[int, str] | None = None,
                         ended_at: dict[int, float] | None = None) -> Any:
    """The static layout of a finished ``--profile`` run: the live view's panels
    fed the kept records at once (so both show the same points).

    ``ended``: rank -> why it stopped early; drawn at ``ended_at[rank]`` (unix
    s), else at the end of the rank's last step.
    """
    modelled = any((s.get("memory") or {}).get("source") == "modelled"
                   for sums in profiling.summaries for s in sums)
    view = RankProfileView(world_size, profiling.every, modelled, t0=t0 or None)
    for r in range(world_size):
        if r < len(profiling.steps) and profiling.steps[r]:
            view.push_steps(r, profiling.steps[r])
        for s in profiling.summaries[r] if r < len(profiling.summaries) else []:
            view.push_summary(r, s)
    for r, reason in sorted((ended or {}).items()):
        steps = profiling.steps[r] if r < len(profiling.steps) else []
        t = (ended_at or {}).get(r) or (float(steps[-1]["t1"]) if steps else view.t0 or 0.0)
        view.rank_ended(r, reason, t)
    view.flush(force=True)
    return view.layout
