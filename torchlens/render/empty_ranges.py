"""A figure with no rows yet gets a placeholder range until its first rows arrive.

Why: BokehJS fits a ``DataRange1d`` to the rows drawn; a figure with none (a
live panel before the ranks' first steps) has no range at all, and BokehJS
logs "could not set initial ranges" on every layout pass (32 warnings when
``%ddp_check --profile``'s view opened). An invisible point at (0, 0) gives
such a figure a range; the browser drops it as soon as one of the figure's
sources gets rows (streamed or replaced), so from then on the axes cover the
rows drawn and nothing else. Apply it when the figure is sent, not when it is
built: a figure filled in Python before it is sent needs no placeholder.
"""

from __future__ import annotations

from typing import Any

from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    DataRange1d,
    GlyphRenderer,
    Plot,
    Scatter,
)

_DROP = "if (anchor.get_length() > 0) { anchor.data = {x: [], y: []} }"


def hold_empty_ranges(root: Any) -> int:
    """Give each plot under ``root`` (a figure or layout) whose sources are all
    empty a placeholder range; the number of plots given one."""
    held = 0
    for plot in root.select({"type": Plot}):
        if not (isinstance(plot.x_range, DataRange1d) or isinstance(plot.y_range, DataRange1d)):
            continue
        sources = {id(r.data_source): r.data_source for r in plot.renderers
                   if isinstance(r, GlyphRenderer) and isinstance(r.data_source, ColumnDataSource)}
        if not sources or any(_rows(s) for s in sources.values()):
            continue
        anchor = ColumnDataSource({"x": [0.0], "y": [0.0]})
        plot.add_glyph(anchor, Scatter(x="x", y="y"), visible=False)
        drop = CustomJS(args={"anchor": anchor}, code=_DROP)
        for source in sources.values():
            source.js_on_change("streaming", drop)
            source.js_on_change("data", drop)
        held += 1
    return held


def _rows(source: ColumnDataSource) -> int:
    return max((len(column) for column in source.data.values()), default=0)
