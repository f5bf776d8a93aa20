"""The report's HTML comes from Jinja2 templates (``templates/``), autoescaped.

Why templates: a report is mailed to colleagues and opened in browsers and
notebooks, and every op name, file path, stack, log line and exception message
in it came from someone's code. Building markup with f-strings meant one
``escape()`` call per value, and one missed call was an injection hole. Here
every ``{{ value }}`` is escaped unless it is ``Markup``: a fragment another
template produced, or the few pieces Bokeh produced itself (marked where they
are made). Renderers compose fragments as ``Markup`` (``+`` and
``Markup().join`` escape any plain string mixed in), so forgetting is safe.

``StrictUndefined`` makes a misspelt variable an error instead of an empty cell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

TEMPLATES = Path(__file__).with_name("templates")

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=jinja2.select_autoescape(enabled_extensions=("html", "j2"),
                                        default_for_string=True, default=True),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
# Jinja's own ``sequence`` test is true for strings and dicts too.
_ENV.tests["listlike"] = lambda value: isinstance(value, (list, tuple))


def render(template: str, **context: Any) -> Markup:
    """``template`` (a name under ``templates/``) rendered with ``context``, escaped."""
    # Markup: autoescaped template output (every {{ value }} escaped unless Markup)
    return Markup(_ENV.get_template(template).render(**context))


def source(name: str) -> str:
    """The text of a static file under ``templates/`` (the page's CSS and JS)."""
    return (TEMPLATES / name).read_text(encoding="utf-8")


def note(text: str) -> Markup:
    """One grey explanatory line."""
    return render("note.html.j2", text=text)


def join(parts: list[Any]) -> Markup:
    """Fragments as one; a plain string among them is escaped, not trusted."""
    return Markup("").join(parts)


def figure_slot(index: int) -> Markup:
    """Where the ``index``-th Bokeh figure's div goes (``report.assemble_page``
    replaces it). Safe: ``%d`` of an int is digits only."""
    return Markup("<!--bokeh-%d-->") % index
