"""Renderers without the glyph copies a static chart never draws.

For every glyph, ``figure.quad``/``vbar``/... also builds a *non-selection*
and a *muted* copy, each a full Bokeh model built in Python and serialized into
the page. A chart with no selecting tool (tap, box or lasso select) never draws
the first, and one whose legend does not mute never draws the second. Left as
``"auto"`` (``add_glyph``'s default), BokehJS derives the same copies from the
glyph in the browser, so nothing on the page changes, while the report's
document holds two models fewer per renderer: every model costs Bokeh a
property walk to build and another to serialize, and every notebook cell that
shows a report pays them.
"""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, GlyphRenderer


def add_bare(fig: Any, glyph: Any, source: ColumnDataSource) -> GlyphRenderer:
    """Draw ``glyph`` (its specs naming ``source``'s columns) on ``fig``; only
    for a renderer that nothing can select and no legend mutes."""
    return fig.add_glyph(source, glyph)


def drop_copies(fig: Any) -> None:
    """Leave out the copies ``figure``'s glyph methods built for ``fig``'s renderers
    (``"auto"``, as ``add_bare`` does): only for a chart with no selecting tool
    whose legend does not mute, so that BokehJS never draws them."""
    for renderer in fig.renderers:
        if isinstance(renderer, GlyphRenderer):
            renderer.nonselection_glyph = "auto"
            renderer.muted_glyph = "auto"
