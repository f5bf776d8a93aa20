"""Where the timeline of ``%ddp_check --profile`` puts each rank's lanes, and
the rows placed on them (``render.ranks.panels``' timeline panel).

A rank's lanes (its threads and streams, named by the summaries) are stacked
in rank order; a lane that appears later moves the lanes below it, so the
rows drawn already are kept with where they go and placed again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from torchlens.analysis.ranks.arrivals import ARRIVED_BY, CollectiveArrival
from torchlens.model.records import StepSummary
from torchlens.model.units import plural
from torchlens.render.columns import as_number

LEVELS = 4  # nesting depths drawn inside one lane (deeper ones share the last)
BAND = 0.8  # a lane's height in lane units
KIND_COLORS = {"op": "#6baed6", "kernel": "#31a354", "memcpy": "#fd8d3c",
               "memset": "#bcbd22", "collective": "#d62728", "other": "#999999"}


#: one value of a timeline source's row (a Bokeh column's cell)
Cell = float | int | str | list[float] | list[int] | None


def lane_names(summary: StepSummary) -> list[str]:
    return list(summary.lanes or []) or ["lane 0"]


def lane_name(summary: StepSummary, index: int) -> str:
    """The name of lane ``index``; the first lane for an index the summary lacks."""
    lanes = lane_names(summary)
    return lanes[index] if 0 <= index < len(lanes) else lanes[0]


class Lanes:
    """Where each (rank, lane) sits on the timeline: rank 0's lanes at the top,
    each rank's in the order they first appeared."""

    def __init__(self, world_size: int) -> None:
        self.names: list[list[str]] = [[] for _ in range(world_size)]
        self.slot: dict[tuple[int, str], int] = {}

    def add(self, rank: int, names: list[str]) -> tuple[bool, bool]:
        """(any lane added, an existing lane moved)."""
        new = [n for n in dict.fromkeys(names) if n not in self.names[rank]]
        if not new:
            return False, False
        self.names[rank] += new
        old, self.slot = self.slot, {}
        for r, lanes in enumerate(self.names):
            for n in lanes:
                self.slot[(r, n)] = len(self.slot)
        return True, any(self.slot[k] != y for k, y in old.items())

    def keep(self, ranks: set[int]) -> bool:
        """Only the lanes of ``ranks`` (the ranks drawn); True when some went."""
        gone = [r for r, names in enumerate(self.names) if names and r not in ranks]
        for r in gone:
            self.names[r] = []
        if gone:
            self.slot = {}
            for r, lanes in enumerate(self.names):
                for n in lanes:
                    self.slot[(r, n)] = len(self.slot)
        return bool(gone)

    def group(self, rank: int) -> tuple[float, float] | None:
        """The rank's lane group (top, bottom) in lane units, None before it has lanes."""
        lanes = self.names[rank]
        if not lanes:
            return None
        return self.slot[(rank, lanes[0])] - 0.5, self.slot[(rank, lanes[-1])] + 0.5


@dataclass
class Box:
    """One op or collective of the timeline, a row of its source: its span
    (s from the view's origin), colour, hover figures, and where it is drawn
    (``top``/``bottom``: lane units, set by ``Timeline.place_box``). ``kind``:
    an op's; ``seq`` and ``bytes``: a collective's (None on an op)."""

    left: float
    right: float
    color: str
    name: str
    ms: float
    rank: int
    lane: str
    step: int
    kind: str | None = None
    seq: int | None = None
    bytes: str | None = None
    top: float = 0.0
    bottom: float = 0.0

    def columns(self) -> dict[str, Cell]:
        out: dict[str, Cell] = {"left": self.left, "right": self.right, "color": self.color,
                                  "name": self.name, "ms": self.ms, "rank": self.rank,
                                  "lane": self.lane, "step": self.step}
        if self.kind is not None:
            out["kind"] = self.kind
        else:
            out.update(seq=self.seq, bytes=self.bytes)
        out.update(top=self.top, bottom=self.bottom)
        return out


@dataclass
class Arrival:
    """A collective across ranks: a line through its ranks' arrivals (``xs``,
    ``ys``) or the mark on the last one (``x``, ``y``), with its hover words."""

    name: str
    seq: int
    step: int
    last: str
    spread_ms: float
    arrived_by: str
    xs: list[float] = field(default_factory=list)
    ys: list[int] = field(default_factory=list)
    x: float = 0.0
    y: int = 0

    def columns(self) -> dict[str, Cell]:
        where: dict[str, Cell] = ({"xs": self.xs, "ys": self.ys} if self.xs
                                    else {"x": self.x, "y": self.y})
        return {**where, "name": self.name, "seq": self.seq, "step": self.step,
                "last": self.last, "spread_ms": self.spread_ms, "arrived_by": self.arrived_by}


@dataclass
class EndMark:
    """A rank that stopped early: a red line at ``x`` over its lanes (``y0``..``y1``)."""

    x: float
    text: str
    label: str
    y0: float = -0.5
    y1: float = 0.5

    def columns(self) -> dict[str, Cell]:
        return {"x": self.x, "y0": self.y0, "y1": self.y1, "text": self.text,
                "label": self.label}


Row = Box | Arrival | EndMark


class Timeline:
    """The timeline's rows, kept (bounded like the sources) with where they go,
    so they can be placed again when a new lane moves the lanes below it."""

    def __init__(self, lanes: Lanes, ops: int, collectives: int, arrivals: int) -> None:
        self.lanes = lanes
        self.ops: deque[tuple[Box, tuple[int, str, int | None]]] = deque(maxlen=ops)
        self.colls: deque[tuple[Box, tuple[int, str, int | None]]] = deque(maxlen=collectives)
        self.arrivals: deque[tuple[Arrival, list[tuple[int, str]]]] = deque(maxlen=arrivals)
        self.last: deque[tuple[Arrival, tuple[int, str]]] = deque(maxlen=arrivals)
        self.ends: list[tuple[EndMark, int]] = []

    def place_box(self, row: Box, where: tuple[int, str, int | None]) -> Box:
        rank, lane, level = where
        y = self.lanes.slot[(rank, lane)]
        if level is None:  # kernels, copies, collectives: the whole lane
            row.top, row.bottom = y - BAND / 2, y + BAND / 2
        else:  # nested host ops: one row per depth, outermost at the top
            h = BAND / LEVELS
            row.top = y - BAND / 2 + level * h
            row.bottom = row.top + h
        return row

    def place_segment(self, row: Arrival, where: list[tuple[int, str]]) -> Arrival:
        row.ys = [self.lanes.slot[k] for k in where]
        return row

    def place_point(self, row: Arrival, where: tuple[int, str]) -> Arrival:
        row.y = self.lanes.slot[where]
        return row

    def place_end(self, row: EndMark, rank: int) -> EndMark:
        row.y0, row.y1 = self.lanes.group(rank) or (-0.5, 0.5)
        return row

    def add_ops(self, rank: int, s: StepSummary, t0: float, budget: int) -> list[Box]:
        """The summary's ``budget`` longest ops (the timeline's share of this rank), placed."""
        ops = sorted(s.ops or [], key=lambda o: -o.dur)[:budget]
        out = []
        for o in ops:
            lane = lane_name(s, o.lane)
            kind = o.kind or "op"
            level = min(o.depth, LEVELS - 1) if kind == "op" else None
            left = o.t0 - t0
            row = Box(left, left + o.dur, KIND_COLORS.get(kind, KIND_COLORS["other"]), o.name,
                      as_number(o.dur, 1e3), rank, lane, s.step, kind=kind)
            where = (rank, lane, level)
            self.ops.append((row, where))
            out.append(self.place_box(row, where))
        return out

    def add_collectives(self, rank: int, s: StepSummary, t0: float) -> list[Box]:
        """The summary's collectives, placed."""
        out = []
        for c in s.collectives or []:
            lane = lane_name(s, c.lane)
            left = c.t0 - t0
            row = Box(left, left + c.dur, KIND_COLORS["collective"], c.name,
                      as_number(c.dur, 1e3), rank, lane, s.step, seq=c.seq,
                      bytes="" if c.bytes is None else plural(c.bytes, "byte"))
            where: tuple[int, str, int | None] = (rank, lane, None)
            self.colls.append((row, where))
            out.append(self.place_box(row, where))
        return out

    def add_arrivals(self, step: int, got: dict[int, StepSummary],
                     arrivals: list[CollectiveArrival], t0: float
                     ) -> tuple[list[Arrival], list[Arrival]]:
        """Each collective of ``step`` that two ranks or more issued, as a line
        across their lanes and a mark on the last rank's; ``got``: rank -> summary."""
        segs, marks = [], []
        for a in arrivals:
            if len(a.ranks) < 2:
                continue
            lanes = [(r, lane_name(got[r], lane))
                     for r, lane in zip(a.ranks, a.lanes, strict=True)]

            def info(a: CollectiveArrival = a) -> Arrival:
                return Arrival(a.name, a.seq, step, f"rank {a.last_rank}", a.spread_ms,
                               ARRIVED_BY[a.arrived_by])

            seg = info()
            seg.xs = [t - t0 for t in a.arrivals]
            seg = self.place_segment(seg, lanes)
            i = a.ranks.index(a.last_rank)
            mark = info()
            mark.x = a.last_arrival - t0
            mark = self.place_point(mark, lanes[i])
            self.arrivals.append((seg, lanes))
            self.last.append((mark, lanes[i]))
            segs.append(seg)
            marks.append(mark)
        return segs, marks
