"""How a report sits in a notebook output: in an iframe (``frontends.kinds.display_bundle``).

Why an iframe with ``srcdoc``: a notebook saves outputs as their MIME data, so
HTML that needs a live kernel or the notebook's own BokehJS shows nothing
after reopening. The full self-contained report (BokehJS inlined) placed in
``srcdoc`` renders again from the saved file alone, and the iframe gives it its
own page, so its BokehJS version and element ids cannot clash with Bokeh
already loaded in the notebook (pyinstrument's magic does the same with a data
URL). ``sandbox="allow-scripts"`` lets the plot and the sortable tables run
while keeping the frame away from the notebook's origin, cookies and kernel.

An untrusted notebook (reopened after it was edited elsewhere, a colleague's
copy) shows outputs through Jupyter's sanitizer: it drops scripts and the
iframe, keeps plain HTML. So a plain line before the frame says why nothing is
drawn and what to do, and a script right after it removes it: where scripts
run, the frame draws and the line is gone.
"""

from __future__ import annotations

import hashlib
from html import escape as escape_html

from torchlens.render import html

IFRAME_HEIGHT_PX = 720  # enough for summary and top ops; resizable by the user


NEEDS_JS = ("This report needs JavaScript, which Jupyter does not run in an untrusted "
            "notebook: trust it (Command Palette: Trust Notebook) or re-run the cell.")


def needs_js_note(key: str) -> str:
    """The plain line an untrusted view shows, and the script that removes it
    where scripts run (its own element: the one before the script, by id)."""
    note_id = "torchlens-needs-js-" + hashlib.sha1(key.encode("utf-8", "replace")).hexdigest()[:12]
    return (f'<p id="{note_id}" class="torchlens-needs-js"><b>{escape_html(NEEDS_JS)}</b></p>'
            "<script>(function () { var s = document.currentScript; "
            "var n = (s && s.previousElementSibling) || "
            f'document.getElementById("{note_id}"); '
            f'if (n && n.id === "{note_id}") {{ n.remove(); }} }})();</script>')


#: After the frame: its height follows the report's (the page template posts it),
#: so the notebook scrolls, not a box inside it. Only a number from this frame is read.
FIT_HEIGHT_JS = (
    "<script>(function () { var s = document.currentScript; "
    "var f = s && s.previousElementSibling; if (!f || f.tagName !== 'IFRAME') { return; } "
    "window.addEventListener('message', function (e) { "
    "var h = e.source === f.contentWindow && e.data && e.data.torchlensReportHeight; "
    "if (typeof h === 'number' && isFinite(h)) { "
    "f.style.height = Math.max(0, Math.ceil(h)) + 2 + 'px'; } }); })();</script>")


def iframe_html(report: str, height: int = IFRAME_HEIGHT_PX) -> str:
    """``report`` as an escaped, sandboxed, vertically resizable iframe, after
    the line an untrusted notebook shows in its place (``needs_js_note``); the
    frame grows to the report's height where scripts run (``FIT_HEIGHT_JS``)."""
    frame = str(html.render("iframe.html.j2", report=report, height=int(height)))
    return needs_js_note(report) + frame + FIT_HEIGHT_JS
