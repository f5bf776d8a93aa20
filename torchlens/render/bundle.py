"""How a report sits in a notebook output: in an iframe (``frontends.kinds.display_bundle``).

Why an iframe with ``srcdoc``: a notebook saves outputs as their MIME data, so
HTML that needs a live kernel or the notebook's own BokehJS shows nothing
after reopening. The full self-contained report (BokehJS inlined) placed in
``srcdoc`` renders again from the saved file alone, and the iframe gives it its
own page, so its BokehJS version and element ids cannot clash with Bokeh
already loaded in the notebook (pyinstrument's magic does the same with a data
URL). ``sandbox="allow-scripts"`` lets the plot and the sortable tables run
while keeping the frame away from the notebook's origin, cookies and kernel.
"""

from __future__ import annotations

from torchlens.render import html

IFRAME_HEIGHT_PX = 720  # enough for summary and top ops; resizable by the user


def iframe_html(report: str, height: int = IFRAME_HEIGHT_PX) -> str:
    """``report`` as an escaped, sandboxed, vertically resizable iframe."""
    return str(html.render("iframe.html.j2", report=report, height=int(height)))
