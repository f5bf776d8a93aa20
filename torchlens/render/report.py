"""The self-contained HTML report: one file that opens anywhere, offline.

BokehJS is inlined (``bokeh.resources.INLINE``) so the file needs no network and
can be mailed to a colleague. The page is assembled from small escaped
fragments (``tables``) and the Bokeh timeline embedded with ``components``.

The output is deterministic: Bokeh numbers its model ids from a process-wide
counter and names documents with random UUIDs, so the same profile rendered
twice would differ. ``stable_ids`` renames them in order of appearance, which
makes a report from a saved ``.tlprof`` byte-identical to the one from the live
result (and reports diffable). Renaming is safe because ids only need to be
unique within the page, and the report is a page of its own (the notebook
bundle puts it in an iframe).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from html import escape
from typing import Any

from bokeh.embed import components
from bokeh.embed.bundle import bundle_for_objs_and_resources
from bokeh.resources import INLINE

from ..model import Profile
from . import tables

#: A kind's ``(profile, analysis, figures) -> (summary line, [section html])``.
ReportParts = Callable[[Profile, Any, list[Any]], tuple[str, list[str]]]

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .4em 0; }
th, td { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: left;
         vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.tl-sort thead th { cursor: pointer; background: #f3f3f3; position: sticky; top: 0; }
th[data-dir="asc"]::after { content: " \\25B2"; } th[data-dir="desc"]::after { content: " \\25BC"; }
table.kv th { font-weight: 600; background: none; }
.note { color: #666; } .summary { font-weight: 600; }
.hint.warning b, .error { color: #b00; } .sev { color: #666; font-size: .9em; }
pre { background: #f7f7f7; padding: .6em; overflow-x: auto; }
"""

# Bokeh ids: "p1234" model ids and UUID document/element ids.
_BOKEH_ID = re.compile(r'"(p\d+|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"')
_DEFINED_ID = re.compile(r'"id":"(p\d+)"')
_SPLIT = "<!--tl-split-->"  # cannot come from a trace: names are escaped


def stable_ids(text: str) -> str:
    """Rename Bokeh's model ids and UUIDs in order of first appearance.

    Only strings Bokeh defined as ids (``"id":"pN"``) and UUIDs are renamed, and
    only where they stand as a whole quoted string, so trace names are untouched.
    """
    ids = set(_DEFINED_ID.findall(text))  # a literal prefix: a fast scan
    mapping: dict[str, str] = {}

    def rename(m: re.Match[str]) -> str:
        token = m.group(1)
        # a quoted UUID is always renamed (so no separate, slow scan for them)
        if token[0] == "p" and token not in ids:
            return m.group(0)
        new = mapping.setdefault(token, f"tl{len(mapping) + 1}")
        return f'"{new}"'

    return _BOKEH_ID.sub(rename, text)


def section(title: str, body: str, anchor: str) -> str:
    """One report section: a heading and its (already escaped) body."""
    return f'<section id="{escape(anchor)}"><h2>{escape(title)}</h2>{body}</section>'


def _header(profile: Profile, summary: str) -> str:
    title = profile.title or f"torchlens {profile.kind} report"
    when = dt.datetime.fromtimestamp(profile.created_at, dt.timezone.utc)
    facts = f"{escape(profile.kind)} · taken {when:%Y-%m-%d %H:%M:%S} UTC"
    if profile.source:
        facts += f" · from {escape(profile.source)}"
    return (
        f"<h1>{escape(title)}</h1><p class=\"note\">{facts}</p>"
        f'<p class="summary">{escape(summary)}</p>'
    )


def _bokehjs(figures: list[Any]) -> str:
    """The BokehJS the figures need, inlined.

    Only the bundles the models use (core BokehJS, not widgets, tables, WebGL
    or MathJax): 1.3 MB instead of the 3.9 MB of ``INLINE.render_js()``.
    """
    if not figures:
        return ""
    bundle = bundle_for_objs_and_resources(figures, INLINE)
    if bundle.js_files or bundle.css_files:  # would need the network to open
        raise RuntimeError("BokehJS resources are not inline")
    js = "".join(f'<script type="text/javascript">{code}</script>' for code in bundle.js_raw)
    return js + "".join(f"<style>{css}</style>" for css in bundle.css_raw)


def assemble_page(profile: Profile, summary: str, sections: list[str],
                  figures: list[Any]) -> tuple[str, str]:
    """Header, environment, the kind's sections, what was not measured and the
    error, with the figures embedded and their ids made stable."""
    parts = [_header(profile, summary)]
    parts.append(section("Environment",
                          f"<details>{tables.environment_html(profile.environment)}</details>",
                          "environment"))
    parts += sections
    if profile.unmeasured:
        parts.append(section("Not measured", tables.unmeasured_html(profile.unmeasured),
                              "unmeasured"))
    if profile.error:
        parts.append(section("The profiled code raised an exception",
                              tables.error_html(profile.error), "error"))
    body, script = "".join(parts), ""
    if figures:
        script, divs = components(figures)
        for i, div in enumerate(divs):
            body = body.replace(f"<!--bokeh-{i}-->", div, 1)
    # One renaming over both: the div and the script name the same ids. BokehJS
    # itself is left alone (it is prepended after the renaming).
    body, script = stable_ids(body + _SPLIT + script).split(_SPLIT)
    return body, _bokehjs(figures) + script


def render_report(profile: Profile, analysis: Any, report_parts: ReportParts) -> str:
    """A self-contained HTML report of ``profile`` (no network needed to open).

    ``report_parts(profile, analysis, figures)`` is the kind's own: it returns
    the summary line and the sections, and appends the Bokeh figures it drew
    to ``figures``; the page around them is the same for every kind.
    """
    figures: list[Any] = []
    summary, sections = report_parts(profile, analysis, figures)
    body, script = assemble_page(profile, summary, sections, figures)
    title = escape(profile.title or f"torchlens {profile.kind} report")
    html = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{title}</title><style>{_CSS}</style></head><body>{body}{script}"
        f"<script>{tables.SORT_JS}</script></body></html>\n"
    )
    return html
