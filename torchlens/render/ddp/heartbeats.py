"""Per-rank figures of a %ddp_check run: drawn live while the ranks run, and
again, from the saved records, in the report.

Why one module for both: the live view (a ``jupyter_bokeh.BokehModel`` whose
``ColumnDataSource``s grow with ``stream(rows, rollover)``, so only new rows
travel to the browser) and the static copy left in the notebook when the run
ends must show the same thing. Widgets are not saved with a notebook, so the
live view is replaced by the report, which draws these figures from the
records.

Input rows are the workers' heartbeats (``t_rel`` seconds since launch, rank,
phase, collective count, rss, tensor_bytes, cuda_allocated). All streaming
happens from the thread that calls ``push``/``flush`` (the launcher's loop).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from bokeh.layouts import column
from bokeh.models import ColumnDataSource, HoverTool, Range1d
from bokeh.plotting import figure

from torchlens.analysis.ranks.spread import SHOWN_RANKS
from torchlens.model.collectives import Fingerprint
from torchlens.model.messages import DdpHeartbeat
from torchlens.model.records import StepRecord, StepSummary
from torchlens.render.columns import FLUSH_S, MIB, rank_color
from torchlens.render.empty_ranges import hold_empty_ranges
from torchlens.render.legend import add_colour_legend, by_colour

ROLLOVER = 5000  # points kept per source in the live view
#: ``training``: a ``--profile`` rank inside the user's loop (its steps are
#: the step records' business), the same green as a checked step
PHASE_COLORS = {"init": "#bbbbbb", "starting": "#bbbbbb", "comm_check": "#9ecae1",
                "step": "#74c476", "training": "#74c476", "checksums": "#fdae6b",
                "done": "#eeeeee", "failed": "#d62728"}
OTHER_PHASE_COLOR = "#cccccc"


def _phase_color(phase: str) -> str:
    return PHASE_COLORS.get(str(phase).split(" ")[0], OTHER_PHASE_COLOR)


@dataclass
class _MemPoint:
    """A point of the memory panel: MiB allocated (or resident) and of live tensors."""

    t: float
    mib: float
    tensor_mib: float
    rank: int
    color: str


@dataclass
class _CollPoint:
    """A point of the collectives panel: how many the rank had issued by ``t``."""

    t: float
    n: int
    rank: int
    color: str


@dataclass
class _Span:
    """A stretch of a rank's lane in one phase."""

    left: float
    right: float
    bottom: float
    top: float
    color: str
    phase: str
    rank: int


@dataclass
class _Tick:
    """A collective's tick on its rank's lane."""

    t: float
    y: int
    label: str


def _columns(rows: Sequence[_MemPoint | _CollPoint | _Span | _Tick]) -> dict[str, list[Any]]:
    """Rows as the column dict a ``ColumnDataSource`` takes or streams."""
    return {f.name: [getattr(r, f.name) for r in rows] for f in fields(rows[0])} if rows else {}


def _mem_value(hb: DdpHeartbeat) -> float:
    cuda = hb.cuda_allocated
    return float(cuda if cuda is not None else hb.rss or 0) / MIB


def _figures(world_size: int, cuda: bool) -> tuple[Any, list[Any], list[Any], Any, Any]:
    """Empty figures with a source per rank (memory, collectives) + timeline.

    A job of more than ``SHOWN_RANKS`` ranks draws every rank's heartbeats as
    points of one source per panel (a line per rank would be a renderer per
    rank: seconds to build and send), its lanes thinner, every k-th labelled.
    """
    many = world_size > SHOWN_RANKS
    tools = "xpan,xwheel_zoom,reset,save"
    points = f" (a point per heartbeat, {world_size:,} ranks)" if many else ""
    mem = figure(height=190, sizing_mode="stretch_width", tools=tools,
                 title=("CUDA allocated per rank (MiB)" if cuda else "RSS per rank (MiB)") + points,
                 x_axis_label="s since launch")
    coll = figure(height=160, sizing_mode="stretch_width", tools=tools, x_range=mem.x_range,
                  title="Collectives issued per rank" + points)
    coll.y_range.start = 0  # a count: no axis below 0 while it waits for its first rows
    row_px = max(1, min(30, 900 // world_size))  # the panel stays about 960 px
    lanes = figure(height=90 + row_px * world_size, sizing_mode="stretch_width", tools=tools,
                   x_range=mem.x_range, title="Per-rank timeline (phase; ticks = collectives)",
                   y_range=(-0.6, world_size - 0.4))
    every = math.ceil(world_size / 40)
    lanes.yaxis.ticker = list(range(0, world_size, every))
    lanes.yaxis.major_label_overrides = {r: f"rank {r}" for r in range(world_size)}
    mem_cols, coll_cols = ("t", "mib", "tensor_mib", "rank", "color"), ("t", "n", "rank", "color")
    if many:
        ms = ColumnDataSource({k: [] for k in mem_cols})
        cs = ColumnDataSource({k: [] for k in coll_cols})
        dots = [mem.scatter("t", "mib", source=ms, color="color", size=3),
                coll.scatter("t", "n", source=cs, color="color", size=3)]
        for fig, dot, tip in ((mem, dots[0], ("MiB", "@mib{0,0.0}")),
                              (coll, dots[1], ("collectives", "@n"))):
            fig.add_tools(HoverTool(renderers=[dot], tooltips=[("", "rank @rank"), tip]))
        mem_src, coll_src = [ms] * world_size, [cs] * world_size
    else:
        mem_src, coll_src = [], []
        for r in range(world_size):
            ms = ColumnDataSource({k: [] for k in mem_cols})
            cs = ColumnDataSource({k: [] for k in coll_cols})
            mem.line("t", "mib", source=ms, color=rank_color(r), legend_label=f"rank {r}")
            mem.line("t", "tensor_mib", source=ms, color=rank_color(r), line_dash="dashed")
            coll.step("t", "n", source=cs, color=rank_color(r), legend_label=f"rank {r}",
                      mode="after")
            # a point per heartbeat too: a rank with one heartbeat in a short run
            # (a 0.2 s step under --strict) has no line to draw, and was missing
            mem.scatter("t", "mib", source=ms, color=rank_color(r), size=4,
                        legend_label=f"rank {r}")
            coll.scatter("t", "n", source=cs, color=rank_color(r), size=4,
                         legend_label=f"rank {r}")
            mem_src.append(ms)
            coll_src.append(cs)
        for fig in (mem, coll):  # above the plot: inside, it covered the lines it names
            legend = fig.legend[0]
            fig.center = [c for c in fig.center if c is not legend]
            legend.update(orientation="horizontal", label_text_font_size="8pt", margin=0,
                          padding=2, click_policy="hide", nrows=2 if world_size > 8 else "auto")
            fig.add_layout(legend, "above")
    quads = ColumnDataSource({"left": [], "right": [], "bottom": [], "top": [], "color": [],
                              "phase": [], "rank": []})
    # outlined in their own colour: spans that touch are drawn touching (edges
    # antialiased on their own left a pale seam that read as a silent moment)
    lanes.quad("left", "right", "bottom", "top", color="color", source=quads, line_width=1)
    add_colour_legend(lanes, [*by_colour(PHASE_COLORS), ("other phase", OTHER_PHASE_COLOR)])
    ticks = ColumnDataSource({"t": [], "y": [], "label": []})
    lanes.scatter("t", "y", source=ticks, marker="dash", angle=1.5708, size=14, color="#333")
    lanes.add_tools(HoverTool(tooltips=[("", "rank @rank @phase @label")]))
    return column(mem, coll, lanes, sizing_mode="stretch_width"), mem_src, coll_src, quads, ticks


def _stream_per_source(sources: list[Any], rows: Sequence[Sequence[_MemPoint | _CollPoint]],
                       rollover: int | None) -> None:
    """Each rank's new rows into its source: one stream per source (many ranks share one)."""
    by_source: dict[int, tuple[Any, list[_MemPoint | _CollPoint]]] = {}
    for src, new in zip(sources, rows, strict=True):
        if new:
            by_source.setdefault(id(src), (src, []))[1].extend(new)
    for src, new in by_source.values():
        src.stream(_columns(new), rollover=rollover)


def label_nodes(layout: Any, heartbeats: Iterable[DdpHeartbeat]) -> bool:
    """Name each lane "rank r (node k)" once heartbeats say where a rank runs
    (``%ddp_check --nnodes``); True when a label changed."""
    lanes = layout.children[2]
    labels = dict(lanes.yaxis.major_label_overrides)
    for hb in heartbeats:
        if hb.node is not None:
            labels[hb.rank] = f"rank {hb.rank} (node {hb.node})"
    if labels == lanes.yaxis.major_label_overrides:
        return False
    lanes.yaxis.major_label_overrides = labels
    return True


class _Rows:
    """Turns heartbeats into rows for the sources (shared by live and static)."""

    def __init__(self, world_size: int) -> None:
        self.prev: list[DdpHeartbeat | None] = [None] * world_size

    def rows(self, hb: DdpHeartbeat) -> tuple[_MemPoint, _CollPoint, _Span | None]:
        r = hb.rank
        t = float(hb.t_rel)
        tensor = hb.tensor_bytes
        mem = _MemPoint(t=t, mib=_mem_value(hb),
                        tensor_mib=float("nan") if tensor is None else tensor / MIB,
                        rank=r, color=rank_color(r))
        coll = _CollPoint(t=t, n=int(hb.collectives or 0), rank=r, color=rank_color(r))
        prev, self.prev[r] = self.prev[r], hb
        quad = None
        if prev is not None:
            quad = _Span(left=float(prev.t_rel), right=t, bottom=r - 0.35, top=r + 0.35,
                         color=_phase_color(hb.phase or ""), phase=str(hb.phase or ""),
                         rank=r)
        return mem, coll, quad


def rank_figures(heartbeats: list[DdpHeartbeat], world_size: int,
                 collectives: list[list[Fingerprint]] | None = None,
                 t0: float = 0.0) -> Any:
    """The static layout from a finished run's heartbeats (and exact collective times)."""
    cuda = any(h.cuda_allocated is not None for h in heartbeats)
    layout, mem_src, coll_src, quads, ticks = _figures(world_size, cuda)
    conv = _Rows(world_size)
    mem_rows: list[list[_MemPoint]] = [[] for _ in range(world_size)]
    coll_rows: list[list[_CollPoint]] = [[] for _ in range(world_size)]
    quad_rows: list[_Span] = []
    last: dict[int, _Span] = {}  # each rank's latest span
    for hb in sorted(heartbeats, key=lambda h: h.t_rel):
        m, c, q = conv.rows(hb)
        mem_rows[hb.rank].append(m)
        coll_rows[hb.rank].append(c)
        if q:
            prev = last.get(q.rank)
            if prev is not None and prev.phase == q.phase:
                prev.right = q.right  # one span per run of one phase
            else:
                quad_rows.append(q)
                last[q.rank] = q
    _stream_per_source(mem_src, mem_rows, None)  # the static copy keeps every point
    _stream_per_source(coll_src, coll_rows, None)
    if quad_rows:
        quads.data = _columns(quad_rows)
    label_nodes(layout, heartbeats)
    tick_rows = [_Tick(t=fp.t - t0, y=r, label=f"#{fp.index} {fp.op} {fp.line}")
                 for r, fps in enumerate(collectives or []) for fp in fps if fp.t]
    if tick_rows:
        ticks.data = _columns(tick_rows)
    if not tick_rows and not any(hb.collectives for hb in heartbeats):
        _hide_collectives(layout)  # nothing counted them (--profile without --strict)
    return layout


def _hide_collectives(layout: Any) -> None:
    """Drop the collectives panel where the heartbeats do not count collectives:
    it would draw a false zero on a -1..1 axis."""
    layout.children[1].visible = False
    # a hidden plot still fits its ranges: without a span BokehJS warns on load
    layout.children[1].y_range = Range1d(0, 1)
    layout.children[2].title.text = "Per-rank timeline (state)"


class LivePlot:
    """The live view: ``push`` heartbeats as they arrive, ``flush`` from the same
    thread (a ``model.feed.RankFeed`` that draws heartbeats alone)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.layout, self.mem, self.coll, self.quads, self.ticks = _figures(world_size, False)
        self._widget: Any = None
        self._rows = _Rows(world_size)
        self._pending: list[DdpHeartbeat] = []
        self._last_count = [0] * world_size
        self._last_flush = 0.0
        self.flushes = 0

    @property
    def widget(self) -> Any:
        """The notebook widget (made on first use: a layout can be in one document only,
        so a view that embeds ``layout`` in a bigger one never asks for it)."""
        if self._widget is None:
            from jupyter_bokeh import BokehModel

            hold_empty_ranges(self.layout)  # its panels open with no rows
            self._widget = BokehModel(self.layout)
        return self._widget

    def start(self) -> None:
        """Nothing to set up: the figures were built with the plot."""

    def push(self, hb: DdpHeartbeat) -> None:
        self._pending.append(hb)

    def push_steps(self, rank: int, records: list[StepRecord]) -> None:
        """Step records are the profiled view's (``frontends.shared.live_view``), not drawn here."""

    def push_summary(self, rank: int, summary: StepSummary) -> None:
        """Summaries are the profiled view's, not drawn here."""

    def rank_ended(self, rank: int, reason: str, t: float | None) -> None:
        """The heartbeats' own phase (done, failed) shows a rank's end."""

    def close(self) -> None:
        """Nothing held open: the widget keeps what it shows."""

    def hide_collectives(self) -> None:
        """Drop the collectives panel: for heartbeats that do not count them
        (``torchlens run``'s ranks), where it would draw a false zero."""
        _hide_collectives(self.layout)

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self._pending or (not force and now - self._last_flush < FLUSH_S):
            return
        self._last_flush = now
        mem: list[list[_MemPoint]] = [[] for _ in range(self.world_size)]
        coll: list[list[_CollPoint]] = [[] for _ in range(self.world_size)]
        quads: list[_Span] = []
        ticks: list[_Tick] = []
        for hb in self._pending:
            r = hb.rank
            m, c, q = self._rows.rows(hb)
            mem[r].append(m)
            coll[r].append(c)
            if q:
                quads.append(q)
            if c.n > self._last_count[r]:
                ticks.append(_Tick(t=c.t, y=r, label=f"{c.n} collectives"))
                self._last_count[r] = c.n
        label_nodes(self.layout, self._pending)
        self._pending.clear()
        # many ranks share one source: it keeps as many points as SHOWN_RANKS lines would
        rollover = ROLLOVER * (SHOWN_RANKS if self.world_size > SHOWN_RANKS else 1)
        _stream_per_source(self.mem, mem, rollover)
        _stream_per_source(self.coll, coll, rollover)
        if quads:
            self.quads.stream(_columns(quads), rollover=ROLLOVER)
        if ticks:
            self.ticks.stream(_columns(ticks), rollover=ROLLOVER)
        self.flushes += 1
