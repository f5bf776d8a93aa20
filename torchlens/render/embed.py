"""The report's Bokeh figures as Bokeh's own ``<script>`` and one ``<div>`` per
figure: what ``bokeh.embed.components`` writes, for a third of its work.

Every shown result in a notebook builds and embeds its figures again, so this
work is paid per cell. ``components`` adds the figures to a new
Document one root at a time (a walk of all their models per root added),
validates the Document (another walk, and every model's checks), walks it once
more for Python callbacks, and only then serializes it. Here:

* the roots are added in one frozen step: one walk, which also reads every
  default the serializer must send (as ``components``' walks do, so the JSON
  is the same);
* no validation: the figures come from this package's fixed code, not from a
  user, and ``tests/render/test_embed.py`` validates every kind's figures;
* the same walk's models tell which BokehJS bundles the page needs (``Walked``);
* no callback check: ``components`` only logs a warning when a model has a
  Python callback (which a static page could never run), and none has one.

The script and the divs come from Bokeh's own templates and serializer, so a
page is the one ``components`` writes; the test compares them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bokeh.document import Document

try:  # Bokeh's internals: a release that moves them gets components() itself
    from bokeh.core.templates import MACROS, ROOT_DIV
    from bokeh.embed.bundle import Script, bundle_for_objs_and_resources
    from bokeh.embed.elements import script_for_render_items
    from bokeh.embed.util import RenderItem
    from bokeh.util.serialization import (
        make_globally_unique_css_safe_id,
        make_globally_unique_id,
    )
except ImportError:  # pragma: no cover - tested by faking the failure
    RenderItem = None


def components(figures: Sequence[Any]) -> tuple[str, list[str], set[Any]]:
    """``(script, divs)`` for ``figures``, as ``bokeh.embed.components(figures)``
    returns them, and every model of the figures (the one walk's, for ``bundle``);
    the figures end up roots of one new Document, as there. With a Bokeh whose
    internals are not where this module reads them, ``components`` itself."""
    if RenderItem is not None:
        try:
            return _components(figures)
        except (TypeError, AttributeError, ValueError):  # internals changed shape
            pass
    from bokeh.embed import components as bokeh_components

    script, divs = bokeh_components(list(figures))
    return script, list(divs), set().union(*(f.references() for f in figures))


def _components(figures: Sequence[Any]) -> tuple[str, list[str], set[Any]]:
    doc = Document()
    with doc.models.freeze():  # one walk of the models when the block ends
        for fig in figures:
            doc.add_root(fig)
    # ids made in components' order: the document's, then one per root
    docid = make_globally_unique_id()
    item = RenderItem(docid, roots={fig: make_globally_unique_css_safe_id() for fig in figures})
    docs_json = {docid: doc.to_json(deferred=False)}
    bundle = bundle_for_objs_and_resources(None, None)
    bundle.add(Script(script_for_render_items(docs_json, [item])))
    return (bundle.scripts(tag=True),
            [ROOT_DIV.render(root=root, macros=MACROS) for root in item.roots], set(doc.models))


class Walked:
    """Models collected already, as ``bundle_for_objs_and_resources`` takes them.

    It asks each object it is given for ``references()``, a walk of every
    property of every model below it: given the figures, it would walk them
    once more after ``components`` did (about 4 ms of every shown report).
    ``tests/render/test_embed.py`` checks that the bundles still follow the models.
    """

    def __init__(self, models: set[Any]) -> None:
        self.models = models

    def references(self) -> set[Any]:
        return self.models
