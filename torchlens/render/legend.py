"""The colour legend of a timeline: one entry per colour of its colour map.

Every timeline (a trace's, the run report's joint one, ``%ddp_check``'s) colours
its bars from one dict (category or kind -> colour). The legend is built from
that same dict, so a colour added to the map is named in the legend without a
second list to keep in step. Keys sharing a colour share one entry
("cuda_runtime / cuda_driver"), so each colour is named exactly once.

The legend's swatches are drawn by one renderer of bars at NaN, one bar per
entry (the entry names its row): they paint nothing on the plot and leave its
ranges alone, and the legend is there from the start in a live view whose bars
arrive later. One renderer for all entries, not one each: a renderer brings
eight Bokeh models into the page (glyphs, source, view, selection), and every
model costs each shown report a serializing walk.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from bokeh.models import ColumnDataSource, GlyphRenderer, Legend, LegendItem, Quad

from torchlens.render.glyphs import add_bare

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
                      alpha: Mapping[str, float] | None = None,
                      drawn: tuple[GlyphRenderer, Mapping[str, int]] | None = None) -> Legend:
    """A legend above ``fig`` naming each (label, colour) of ``entries``;
    ``alpha``: the fill alpha of a label whose bars are drawn translucent.
    ``drawn``: a finished chart's renderer and, per colour, the row of one of
    its bars: the swatches are those bars' (no renderer of the legend's own)."""
    entries = list(entries)
    if drawn is not None:
        renderer, rows = drawn
        return _legend(fig, [LegendItem(label=label, renderers=[renderer], index=rows[colour])
                             for label, colour in entries])
    # NaN rows: BokehJS draws a legend swatch from a row's visuals (none without
    # a row), and a NaN bar is neither drawn nor counted in a range
    nans = [NAN] * len(entries)
    swatches = add_bare(fig, Quad(left="left", right="right", bottom="bottom", top="top",
                                  fill_color="color", fill_alpha="alpha", line_color=None),
                        ColumnDataSource({
                            "left": nans, "right": nans, "bottom": nans, "top": nans,
                            "color": [colour for _, colour in entries],
                            "alpha": [(alpha or {}).get(label, 1.0) for label, _ in entries]}))
    return _legend(fig, [LegendItem(label=label, renderers=[swatches], index=i)
                         for i, (label, _) in enumerate(entries)])


def _legend(fig: Any, items: list[LegendItem]) -> Legend:
    legend = Legend(items=items, name=LEGEND_NAME, orientation="horizontal",
                    nrows=max(1, math.ceil(len(items) / PER_ROW)),
                    label_text_font_size="8pt", glyph_width=14, glyph_height=10,
                    spacing=8, padding=2, margin=2, click_policy="none")
    fig.add_layout(legend, "above")
    return legend


def legend_above(fig: Any) -> None:
    """Move a figure's own legend (the one ``legend_label`` built) above it in
    rows of PER_ROW, as add_colour_legend's: a legend at the right of a chart
    in a narrow column leaves the plot a sliver and runs past the page."""
    legends = list(fig.legend)
    if not legends:
        return
    legend = legends[0]
    fig.center = [c for c in fig.center if c is not legend]
    legend.update(orientation="horizontal", nrows=max(1, math.ceil(len(legend.items) / PER_ROW)),
                  label_text_font_size="8pt", glyph_width=14, glyph_height=10,
                  spacing=8, padding=2, margin=2)
    fig.add_layout(legend, "above")


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
