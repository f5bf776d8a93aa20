"""A figure with nothing to draw yet gets a placeholder range until it has.

Why: BokehJS fits a ``DataRange1d`` to the rows drawn; a figure with none (a
live panel before the ranks' first steps), or with rows of NaN only (the
allocator panels of a run that measures no allocator), has no range at all,
and BokehJS logs "could not set initial ranges" on every layout pass (32
warnings when ``%ddp_check --profile``'s view opened). An invisible point at
(1, 1) gives such a figure a range, 0 to 2 (BokehJS's default span around a
lone point: no negative milliseconds or MiB on a panel waiting for its
data); the browser drops it as soon as one of the figure's sources gets a
finite point (streamed or replaced), so from then on the axes cover the rows
drawn and nothing else. Apply it when the figure is sent: a figure filled in
Python with finite rows needs no placeholder.
"""

from __future__ import annotations

import math
from typing import Any

from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    DataRange1d,
    GlyphRenderer,
    Plot,
    Scatter,
)

X_PROPS = ("x", "x0", "x1", "left", "right", "xs")
Y_PROPS = ("y", "y0", "y1", "top", "bottom", "ys")
#: a source has something to draw: a row with a finite x and a finite y
_DROP = """
const finite = (col) => col != null && Array.from(col).flat(2).some(
  (v) => typeof v === 'number' && isFinite(v));
const drawn = (src, xs, ys) => xs.some((k) => finite(src.data[k])) &&
  ys.some((k) => finite(src.data[k]));
if (anchor.get_length() > 0 && fields.some(([src, xs, ys]) => drawn(src, xs, ys))) {
  anchor.data = {x: [], y: []}
}"""


def hold_empty_ranges(root: Any) -> int:
    """Give each plot under ``root`` (a figure or layout) whose sources draw
    no finite point a placeholder range; the number of plots given one."""
    held = 0
    for plot in root.select({"type": Plot}):
        if not (isinstance(plot.x_range, DataRange1d) or isinstance(plot.y_range, DataRange1d)):
            continue
        fields = _fields(plot)
        if not fields or any(_drawn(src, xs, ys) for src, xs, ys in fields.values()):
            continue
        anchor = ColumnDataSource({"x": [1.0], "y": [1.0]})
        plot.add_glyph(anchor, Scatter(x="x", y="y"), visible=False)
        drop = CustomJS(args={"anchor": anchor, "fields": [list(f) for f in fields.values()]},
                        code=_DROP)
        for source, _, _ in fields.values():
            source.js_on_change("streaming", drop)
            source.js_on_change("data", drop)
        held += 1
    return held


def _fields(plot: Plot) -> dict[int, tuple[ColumnDataSource, list[str], list[str]]]:
    """Per source of ``plot``'s glyphs: the columns drawn on x and on y."""
    out: dict[int, tuple[ColumnDataSource, list[str], list[str]]] = {}
    for r in plot.renderers:
        if not (isinstance(r, GlyphRenderer) and isinstance(r.data_source, ColumnDataSource)):
            continue
        src = r.data_source
        _, xs, ys = out.setdefault(id(src), (src, [], []))
        for props, names in ((X_PROPS, xs), (Y_PROPS, ys)):
            for prop in props:
                spec = r.glyph.properties_with_values(include_defaults=False).get(prop)
                field = getattr(spec, "field", spec)  # a Field, or a column's name
                if isinstance(field, str) and field in src.data and field not in names:
                    names.append(field)
    return {k: v for k, v in out.items() if v[1] and v[2]}


def _drawn(source: ColumnDataSource, xs: list[str], ys: list[str]) -> bool:
    return _finite(source, xs) and _finite(source, ys)


def _finite(source: ColumnDataSource, names: list[str]) -> bool:
    def flat(values: Any) -> Any:
        for v in values:
            if isinstance(v, (list, tuple)):
                yield from flat(v)
            else:
                yield v

    return any(isinstance(v, (int, float)) and math.isfinite(v)
               for name in names for v in flat(source.data.get(name, [])))
