"""A step-time chart's y-axis held to a robust top, with what is above it said.

Why: one spike (a 350 ms step among 55 ms ones: a garbage collection, a
checkpoint) fitted the axis to itself and left every other line flat at the
bottom. The axis runs to ``TOP_FACTOR`` times the 99th percentile of the
points drawn when the highest is above that; every point is still drawn: a
line above the axis leaves the frame through its top, each point above it
gets a red mark at the top edge (hover: its time) and the chart says, above
the plot, how many points are off the axis and the highest ("1 step above
the axis: 350.0 ms at step 425 (rank 1)"). So the rule that every axis
covers what it draws holds, or is said where it does not.

The y range keeps fitting in the browser: it follows one invisible frame
renderer (the points' lowest value and the top) while points are off the
axis, and every renderer again once none is.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool, Title

TOP_FACTOR = 1.5
QUANTILE = 99
#: a new top within this share of the old one keeps the old (no redraw per flush)
HOLD = 0.1
MARK_COLOR = "#b00"


def _finite(values: Sequence[Any]) -> np.ndarray:
    return np.asarray([v for v in values if isinstance(v, (int, float)) and math.isfinite(v)],
                      dtype=float)


def robust_top(values: Sequence[float], groups: Sequence[Hashable] | None = None) -> float | None:
    """The axis top when the highest finite value is above ``TOP_FACTOR`` x the
    99th percentile, else None (the axis fits every point). ``groups`` (a rank
    per value): the percentile is each rank's own and the highest of them
    counts, so a spike every rank has once (the warm-up step 0: 2 of 60 points
    of a 2-rank run, above the 99th percentile of them all) is still one
    rank's outlier."""
    finite = _finite(values)
    if finite.size == 0:
        return None
    if groups is None:
        ref = float(np.percentile(finite, QUANTILE, method="lower"))  # a data point
    else:
        by: dict[Hashable, list[float]] = {}
        for v, g in zip(values, groups, strict=True):
            by.setdefault(g, []).append(v)
        ref = max(float(np.percentile(f, QUANTILE, method="lower"))
                  for f in map(_finite, by.values()) if f.size)
    top = TOP_FACTOR * ref
    return top if top > 0 and float(finite.max()) > top else None


def above_words(above: list[tuple[float, str]], unit: str = "step") -> str:
    """"1 step above the axis: 350.0 ms at step 425" for (ms, where) points."""
    if not above:
        return ""
    ms, where = max(above)
    n = len(above)
    if n == 1:
        return f"1 {unit} above the axis: {ms:,.1f} ms at {where}"
    return f"{n:,} {unit}s above the axis, the highest {ms:,.1f} ms at {where}"


class CappedAxis:
    """The robust top of ``fig``'s y-axis; ``update`` with the points drawn."""

    def __init__(self, fig: Any, unit: str = "step") -> None:
        self.fig, self.unit, self.top = fig, unit, None
        self.frame = ColumnDataSource({"x": [], "y": []})
        self.frame_renderer = fig.scatter("x", "y", source=self.frame, alpha=0)
        self.marks = ColumnDataSource({"x": [], "y": [], "text": []})
        marks = fig.scatter("x", "y", source=self.marks, marker="triangle", size=9,
                            color=MARK_COLOR)
        fig.add_tools(HoverTool(renderers=[marks], tooltips=[("above the axis", "@text")]))
        self.note = Title(text="", text_color=MARK_COLOR, text_font_size="9pt",
                          text_font_style="normal")
        fig.add_layout(self.note, "above")

    def update(self, xs: Sequence[float], ys: Sequence[float], where: Sequence[str],
               groups: Sequence[Hashable] | None = None) -> None:
        """``where``: each point's words ("step 425 (rank 1)"); ``groups``: each
        point's rank (``robust_top``)."""
        top = robust_top(ys, groups)
        if top is None:
            if self.top is not None:
                self.top = None
                self.fig.y_range.renderers = []
                self.frame.data = {"x": [], "y": []}
                self.marks.data = {"x": [], "y": [], "text": []}
                self.note.text = ""
            return
        if self.top is not None and abs(top - self.top) <= HOLD * self.top:
            top = self.top
        above = [(x, y, w) for x, y, w in zip(xs, ys, where, strict=True)
                 if isinstance(y, (int, float)) and math.isfinite(y) and y > top]
        low = min(y for y in ys if isinstance(y, (int, float)) and math.isfinite(y))
        finite_x = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
        self.frame.data = {"x": [min(finite_x), max(finite_x)], "y": [low, top]}
        self.marks.data = {"x": [x for x, _, _ in above], "y": [top] * len(above),
                           "text": [f"{y:,.1f} ms at {w}" for _, y, w in above]}
        self.note.text = above_words([(y, w) for _, y, w in above], self.unit)
        if self.top is None:
            self.fig.y_range.renderers = [self.frame_renderer]
        self.top = top
