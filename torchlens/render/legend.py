"""The colour legend of a timeline: one entry per colour of its colour map.

Every timeline (a trace's, the run report's joint one, ``%ddp_check``'s) colours
its bars from one dict (category or kind -> colour). The legend is built from
that same dict, so a colour added to the map is named in the legend without a
second list to keep in step. Keys sharing a colour share one entry
("cuda_runtime / cuda_driver"), so each colour is named exactly once.

The legend's swatches are drawn by renderers of one bar at NaN: they paint
nothing on the plot and leave its ranges alone, and the legend is there from
the start in a live view whose bars arrive later.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from bokeh.models import Legend, LegendItem

#: The name every timeline's legend model carries (tests and the page find it by it).
LEGEND_NAME = "timeline-legend"
NAN = float("nan")
#: entries per legend row: a row of 1200 px holds five "name / name" labels
PER_ROW = 5


def by_colour(colours: Mapping[str, str]) -> list[tuple[str, str]]:
    """(label, colour) per distinct colour, in the map's order; keys sharing a
    colour are named together."""
    names: dict[str, list[str]] = {}
    for key, colour in colours.items():
        names.setdefault(colour, []).append(key)
    return [(" / ".join(keys), colour) for colour, keys in names.items()]


def add_colour_legend(fig: Any, entries: Iterable[tuple[str, str]],
                      alpha: Mapping[str, float] | None = None) -> Legend:
    """A legend above ``fig`` naming each (label, colour) of ``entries``;
    ``alpha``: the fill alpha of a label whose bars are drawn translucent."""
    items = []
    for label, colour in entries:
        # one row at NaN: BokehJS draws a legend swatch from a row's visuals (none
        # without a row), and a NaN bar is neither drawn nor counted in a range
        swatch = fig.quad(left=[NAN], right=[NAN], bottom=[NAN], top=[NAN], fill_color=colour,
                          fill_alpha=(alpha or {}).get(label, 1.0), line_color=None)
        items.append(LegendItem(label=label, renderers=[swatch]))
    legend = Legend(items=items, name=LEGEND_NAME, orientation="horizontal",
                    nrows=max(1, math.ceil(len(items) / PER_ROW)),
                    label_text_font_size="8pt", glyph_width=14, glyph_height=10,
                    spacing=8, padding=2, margin=2, click_policy="none")
    fig.add_layout(legend, "above")
    return legend


def legend_below(fig: Any) -> None:
    """Move a figure's legend out of the plot, under it: a legend inside a
    small chart covers the lines it names (the gpumem timeline's did)."""
    legends = list(fig.legend)
    if not legends:
        return
    legend = legends[0]
    fig.center = [c for c in fig.center if c is not legend]
    legend.orientation = "horizontal"
    legend.click_policy = "hide"
    fig.add_layout(legend, "below")
