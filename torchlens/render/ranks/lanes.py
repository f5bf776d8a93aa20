"""Where the timeline of ``%ddp_check --profile`` puts each rank's lanes, and
the rows placed on them (``render.ranks.panels``' timeline panel).

A rank's lanes (its threads and streams, named by the summaries) are stacked
in rank order; a lane that appears later moves the lanes below it, so the
rows drawn already are kept with where they go and placed again.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from torchlens.analysis.ranks.arrivals import ARRIVED_BY
from torchlens.model.units import plural
from torchlens.render.columns import as_number

LEVELS = 4  # nesting depths drawn inside one lane (deeper ones share the last)
BAND = 0.8  # a lane's height in lane units
KIND_COLORS = {"op": "#6baed6", "kernel": "#31a354", "memcpy": "#fd8d3c",
               "memset": "#bcbd22", "collective": "#d62728", "other": "#999999"}


def lane_names(summary: dict[str, Any]) -> list[str]:
    return [str(n) for n in summary.get("lanes") or []] or ["lane 0"]


def lane_name(summary: dict[str, Any], index: Any) -> str:
    """The name of lane ``index``; the first lane for an index the summary lacks."""
    lanes = lane_names(summary)
    i = int(index or 0)
    return lanes[i] if 0 <= i < len(lanes) else lanes[0]


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


class Timeline:
    """The timeline's rows, kept (bounded like the sources) with where they go,
    so they can be placed again when a new lane moves the lanes below it."""

    def __init__(self, lanes: Lanes, ops: int, collectives: int, arrivals: int) -> None:
        self.lanes = lanes
        self.ops: deque[tuple[dict[str, Any], Any]] = deque(maxlen=ops)
        self.colls: deque[tuple[dict[str, Any], Any]] = deque(maxlen=collectives)
        self.arrivals: deque[tuple[dict[str, Any], Any]] = deque(maxlen=arrivals)
        self.last: deque[tuple[dict[str, Any], Any]] = deque(maxlen=arrivals)
        self.ends: list[tuple[dict[str, Any], Any]] = []

    def place_box(self, row: dict[str, Any], where: tuple[int, str, int | None]) -> dict[str, Any]:
        rank, lane, level = where
        y = self.lanes.slot[(rank, lane)]
        if level is None:  # kernels, copies, collectives: the whole lane
            row["top"], row["bottom"] = y - BAND / 2, y + BAND / 2
        else:  # nested host ops: one row per depth, outermost at the top
            h = BAND / LEVELS
            row["top"] = y - BAND / 2 + level * h
            row["bottom"] = row["top"] + h
        return row

    def place_segment(self, row: dict[str, Any], where: list[tuple[int, str]]) -> dict[str, Any]:
        row["ys"] = [self.lanes.slot[k] for k in where]
        return row

    def place_point(self, row: dict[str, Any], where: tuple[int, str]) -> dict[str, Any]:
        row["y"] = self.lanes.slot[where]
        return row

    def place_end(self, row: dict[str, Any], rank: int) -> dict[str, Any]:
        top, bottom = self.lanes.group(rank) or (-0.5, 0.5)
        row["y0"], row["y1"] = top, bottom
        return row

    def add_ops(self, rank: int, s: dict[str, Any], t0: float,
                budget: int) -> list[dict[str, Any]]:
        """The summary's ``budget`` longest ops (the timeline's share of this rank), placed."""
        ops = sorted(s.get("ops") or [], key=lambda o: -(o.get("dur") or 0.0))[:budget]
        out = []
        for o in ops:
            lane = lane_name(s, o.get("lane"))
            kind = str(o.get("kind") or "op")
            level = min(int(o.get("depth") or 0), LEVELS - 1) if kind == "op" else None
            left = float(o["t0"]) - t0
            row = {"left": left, "right": left + float(o.get("dur") or 0.0),
                   "color": KIND_COLORS.get(kind, KIND_COLORS["other"]), "name": str(o.get("name", "")),
                   "ms": as_number(o.get("dur"), 1e3), "rank": rank, "lane": lane,
                   "step": int(s["step"]), "kind": kind}
            where = (rank, lane, level)
            self.ops.append((row, where))
            out.append(self.place_box(row, where))
        return out

    def add_collectives(self, rank: int, s: dict[str, Any], t0: float) -> list[dict[str, Any]]:
        """The summary's collectives, placed."""
        out = []
        for c in s.get("collectives") or []:
            lane = lane_name(s, c.get("lane"))
            left = float(c["t0"]) - t0
            size = c.get("bytes")
            row = {"left": left, "right": left + float(c.get("dur") or 0.0),
                   "color": KIND_COLORS["collective"], "name": str(c.get("name", "")),
                   "ms": as_number(c.get("dur"), 1e3), "rank": rank, "lane": lane,
                   "step": int(s["step"]), "seq": c.get("seq"),
                   "bytes": "" if size is None else plural(int(size), "byte")}
            where = (rank, lane, None)
            self.colls.append((row, where))
            out.append(self.place_box(row, where))
        return out

    def add_arrivals(self, step: int, got: dict[int, dict[str, Any]],
                     arrivals: list[dict[str, Any]], t0: float
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Each collective of ``step`` that two ranks or more issued, as a line
        across their lanes and a mark on the last rank's; ``got``: rank -> summary."""
        segs, marks = [], []
        for a in arrivals:
            if len(a["ranks"]) < 2:
                continue
            lanes = [(r, lane_name(got[r], lane))
                     for r, lane in zip(a["ranks"], a["lanes"], strict=True)]
            info = {"name": a["name"], "seq": a["seq"], "step": step,
                    "last": f"rank {a['last_rank']}", "spread_ms": a["spread_ms"],
                    "arrived_by": ARRIVED_BY[a["arrived_by"]]}
            seg = self.place_segment({"xs": [t - t0 for t in a["arrivals"]], **info}, lanes)
            i = a["ranks"].index(a["last_rank"])
            mark = self.place_point({"x": a["last_arrival"] - t0, **info}, lanes[i])
            self.arrivals.append((seg, lanes))
            self.last.append((mark, lanes[i]))
            segs.append(seg)
            marks.append(mark)
        return segs, marks
