"""Many ranks shown as a few: the spread across ranks at each step, and which
ranks to draw on their own.

A live view of hundreds of ranks cannot draw a line per rank (each line is a
Bokeh renderer: at 256 ranks the step and memory panels took 7 s to build and
6 s to send, and a legend of 1,024 names hides the plot). What a user reads
from such a view is the spread (is every rank alike, or do some take longer
or hold more) and the ranks that stand out: the slow rank, the ranks that
stopped early, the slowest and the largest. ``Spread`` holds the first,
``ranks_to_show`` picks the second.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from statistics import median
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchlens.analysis.ranks.verdict import RankRow

#: ranks drawn with a line of their own; a larger job draws its spread as well
SHOWN_RANKS = 16


class Spread:
    """Per step, each rank's latest value of ``keys`` (a rank's record of a
    step it sent again replaces the old one), as low / median / high."""

    def __init__(self, keys: Sequence[str], keep: int | None = None) -> None:
        self.keys = tuple(keys)
        # Each rank's value of the newest ``keep`` steps is held, so a rank
        # that reports late still moves its step's band; older steps' bands
        # are final (a value per rank and step: 1,024 ranks x 5,000 steps x
        # 5 keys would be gigabytes).
        self.keep = keep
        self._values: dict[Any, dict[str, dict[int, float]]] = {}
        self._changed: set[Any] = set()
        self._floor: Any = None  # the newest step forgotten

    def add(self, rank: int, rows: Iterable[dict[str, Any]]) -> None:
        """``rows``: dicts with ``step`` and any of ``keys`` (missing or NaN: not
        measured). A step older than those held is too late: ignored."""
        for row in rows:
            if self._floor is not None and row["step"] <= self._floor:
                continue
            at = self._values.setdefault(row["step"], {k: {} for k in self.keys})
            for k in self.keys:
                v = row.get(k)
                if isinstance(v, (int, float)) and math.isfinite(v):
                    at[k][rank] = float(v)
            self._changed.add(row["step"])
        if self.keep is not None and len(self._values) > self.keep + self.keep // 8:
            # in batches (sorting costs); a step not yet sent by ``changed`` stays
            old = [s for s in sorted(self._values)[:-self.keep] if s not in self._changed]
            for step in old:
                del self._values[step]
            if old:
                self._floor = old[-1]

    def changed(self) -> dict[str, list[Any]]:
        """The steps added to since the last call, in order: ``step``, ``ranks``
        (how many sent it) and ``<key>_lo``, ``<key>_mid``, ``<key>_hi`` (NaN
        where no rank measured it). Only those: a live view sends a step's
        new figures, not every step's again."""
        steps, self._changed = sorted(self._changed), set()
        out: dict[str, list[Any]] = {"step": steps, "ranks": []}
        for k in self.keys:
            out[f"{k}_lo"], out[f"{k}_mid"], out[f"{k}_hi"] = [], [], []
        for s in steps:
            at = self._values[s]
            out["ranks"].append(max(len(v) for v in at.values()) if at else 0)
            for k in self.keys:
                vals = list(at[k].values())
                lo, mid, hi = ((min(vals), median(vals), max(vals)) if vals
                               else (math.nan,) * 3)
                out[f"{k}_lo"].append(lo)
                out[f"{k}_mid"].append(mid)
                out[f"{k}_hi"].append(hi)
        return out


def ranks_to_show(table: list[RankRow], first: Sequence[int], current: Sequence[int],
                  limit: int = SHOWN_RANKS) -> list[int]:
    """The ranks drawn on their own, at most ``limit``.

    ``first``: ranks that must be drawn, in order (the slow rank, the ranks
    that stopped early). The rest alternate the slowest median step and the
    largest peak memory (``table``: the rows of ``rank_steps.rank_table``). A rank
    drawn already (``current``) stays while it is still among the ``limit``
    slowest or the ``limit`` largest, so the lines do not change rank at
    every refresh when ranks are alike.
    """
    def peak(row: RankRow) -> float | None:
        return row.peak_allocated if row.peak_allocated is not None else row.peak_rss

    def by(value: Callable[[RankRow], float | None]) -> list[int]:
        rows = [(r, v) for r in table if isinstance(v := value(r), (int, float))
                and math.isfinite(v)]
        return [r.rank for r, _ in sorted(rows, key=lambda rv: (-rv[1], rv[0].rank))]

    slowest, largest = by(lambda r: r.step_ms), by(peak)
    ranked = [r for pair in zip(slowest, largest, strict=False) for r in pair]
    ranked += slowest[len(largest):] + largest[len(slowest):]
    top = set(ranked[:2 * limit])
    keep = [r for r in current if r in top]
    known = [row.rank for row in table]
    out = list(dict.fromkeys([*first, *keep, *ranked, *current, *known]))
    return out[:limit]
