"""The self-contained HTML report: one file that opens anywhere, offline.

BokehJS is inlined (``bokeh.resources.INLINE``) so the file needs no network and
can be mailed to a colleague. The page is assembled from autoescaped template
fragments (``render.html``, ``templates/``) and the Bokeh figures embedded as
Bokeh's ``components`` would (``render.embed``, for less work per shown result).

The output is deterministic: Bokeh numbers its model ids from a process-wide
counter and names documents with random UUIDs, so the same profile rendered
twice would differ. ``stable_ids`` renames them in order of appearance, which
makes a report from a saved ``.tlprof`` byte-identical to the one from the live
result (and reports diffable). Renaming is safe because ids only need to be
unique within the page, and the report is a page of its own (the notebook
bundle puts it in an iframe).
"""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import re
from collections.abc import Callable
from typing import Any

from bokeh.embed.bundle import bundle_for_objs_and_resources
from bokeh.resources import CDN, INLINE
from markupsafe import Markup

from torchlens.model import Profile
from torchlens.render import embed, html, tables

#: A kind's ``(profile, analysis, figures) -> (summary line, [section Markup])``.
ReportParts = Callable[[Profile, Any, list[Any]], tuple[str, list[Markup]]]

# Bokeh ids: "p1234" model ids and UUID document/element ids.
_BOKEH_ID = re.compile(r'"(p\d+|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"')
_DEFINED_ID = re.compile(r'"id":"(p\d+)"')
_SCRIPT_TAG = re.compile(r'<script(?: type="text/javascript")?>')  # Bokeh's own tags
_AFTER = "text/x-torchlens-after-bokehjs"  # the script type the packed loader runs
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


def section(title: str, body: Markup, anchor: str) -> Markup:
    """One report section: a heading and its body (a template's ``Markup``;
    a plain string would be escaped and shown as text)."""
    return html.render("section.html.j2", title=title, body=body, anchor=anchor)


def _header(profile: Profile, summary: str) -> Markup:
    when = dt.datetime.fromtimestamp(profile.created_at, dt.timezone.utc)
    return html.render("header.html.j2", title=_title(profile), kind=profile.kind,
                       when=f"{when:%Y-%m-%d %H:%M:%S}", source=profile.source or "",
                       summary=summary)


def _title(profile: Profile) -> str:
    return profile.title or f"torchlens {profile.kind} report"


def _bokehjs(models: set[Any], packed: bool) -> Markup:
    """The BokehJS the figures need (``models``: all of theirs), inlined.

    Only the bundles the models use (core BokehJS, not widgets, tables, WebGL
    or MathJax): 1.3 MB instead of the 3.9 MB of ``INLINE.render_js()``.
    ``packed`` stores it gzipped and base64-encoded (about 0.45 MB), unpacked
    by the browser's ``DecompressionStream`` when the page opens: every result
    shown in a notebook carries its own copy (``bundle.iframe_html``), so ten
    profiled cells would otherwise add about 15 MB to the saved notebook.

    Bokeh names the bundles the figures need as CDN addresses without reading
    a file; each set is inlined once per process. An inline bundle reads and
    decodes the 1.3 MB from disk three times (about 10 ms of every shown
    result), and packing it takes about a tenth of a second more.
    """
    if not models:
        return Markup("")
    need = bundle_for_objs_and_resources([embed.Walked(models)], CDN)
    key = (tuple(str(url) for url in need.js_files), tuple(need.js_raw),
           tuple(str(url) for url in need.css_files), tuple(need.css_raw), packed)
    if key not in _INLINED:
        if len(_INLINED) >= 8:  # a session with many bundle sets keeps the latest
            _INLINED.clear()
        _INLINED[key] = _inline_bokehjs(models, packed)
    return _INLINED[key]


_INLINED: dict[tuple[Any, ...], Markup] = {}


def _inline_bokehjs(models: set[Any], packed: bool) -> Markup:
    bundle = bundle_for_objs_and_resources([embed.Walked(models)], INLINE)
    if bundle.js_files or bundle.css_files:  # would need the network to open
        raise RuntimeError("BokehJS resources are not inline")
    # Markup: BokehJS's own code and CSS from the installed bokeh package, not
    # user data; escaping would break it (<script> and <style> are raw text).
    css = [Markup(code) for code in bundle.css_raw]
    if packed:
        code = ";\n".join(bundle.js_raw).encode()
        blob = base64.b64encode(gzip.compress(code, 9, mtime=0)).decode("ascii")
        return html.render("bokehjs_packed.html.j2", blob=blob, css=css)
    return html.render("bokehjs.html.j2", js=[Markup(code) for code in bundle.js_raw], css=css)


def assemble_page(profile: Profile, summary: str, sections: list[Markup],
                  figures: list[Any], packed: bool = False) -> tuple[Markup, Markup]:
    """Header, environment, the kind's sections, what was not measured and the
    error, with the figures embedded and their ids made stable."""
    parts = [_header(profile, summary)]
    parts.append(section("Environment",
                         html.render("details.html.j2", summary="",
                                     body=tables.environment_html(profile.environment)),
                         "environment"))
    parts += sections
    if profile.unmeasured:
        parts.append(section("Not measured", tables.unmeasured_html(profile.unmeasured),
                             "unmeasured"))
    if profile.error:
        parts.append(section("The profiled code raised an exception",
                             tables.error_html(profile.error), "error"))
    body, script, models = str(html.join(parts)), "", set()
    if figures:
        script, divs, models = embed.components(figures)
        for i, div in enumerate(divs):
            body = body.replace(str(html.figure_slot(i)), div, 1)
    # One renaming over both: the div and the script name the same ids. BokehJS
    # itself is left alone (it is prepended after the renaming).
    body, script = stable_ids(body + _SPLIT + script).split(_SPLIT)
    # Markup: the body is escaped template output with Bokeh's own divs put in
    # the figure slots, the script is Bokeh's ``components`` script (figure
    # data serialized and escaped by Bokeh); the renaming touches only ids.
    if packed:  # Bokeh's embedding script runs once the packed BokehJS is unpacked
        script = _SCRIPT_TAG.sub(f'<script type="{_AFTER}">', script)
    return Markup(body), _bokehjs(models, packed) + Markup(script)


def render_report(profile: Profile, analysis: Any, report_parts: ReportParts,
                  packed: bool = False) -> str:
    """A self-contained HTML report of ``profile`` (no network needed to open).

    ``report_parts(profile, analysis, figures)`` is the kind's own: it returns
    the summary line and the sections, and appends the Bokeh figures it drew
    to ``figures``; the page around them is the same for every kind.
    ``packed``: BokehJS gzipped (see ``_bokehjs``), for the notebook's copy;
    a report file keeps it plain, so it opens in any browser.
    """
    figures: list[Any] = []
    summary, sections = report_parts(profile, analysis, figures)
    body, script = assemble_page(profile, summary, sections, figures, packed)
    # a plain str: whoever embeds the page (the iframe's srcdoc) must escape it
    return str(html.render("page.html.j2", title=_title(profile), body=body,
                           script=script)) + "\n"
