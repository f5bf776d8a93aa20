"""Where the timeline of ``%ddp_check --profile`` puts each rank's lanes, and
the rows placed on them (``render.rank_live``'s timeline panel).

A rank's lanes (its threads and streams, named by the summaries) are stacked
in rank order; a lane that appears later moves the lanes below it, so the
rows drawn already are kept with where they go and placed again.
"""

from __future__ import annotations

from collections import deque
from typing import Any

LEVELS = 4  # nesting depths drawn inside one lane (deeper ones share the last)
BAND = 0.8  # a lane's height in lane units


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
