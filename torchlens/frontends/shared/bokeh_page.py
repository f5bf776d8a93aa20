"""Loading BokehJS into the notebook page before a live ``jupyter_bokeh`` widget.

Why: a ``jupyter_bokeh.BokehModel`` draws with the page's ``window.Bokeh``; in
JupyterLab nothing else loads it, and a widget shown before it is there fails
with "Failed to create view for 'BokehView' ... reading 'require'". Every
live view (``%gpumonitor``, ``%ddp_check``) calls ``load_bokehjs`` right
before it displays its widget.

The scripts are inline (no CDN: the machines this runs on often have no
network) and only the bundles the figures need (the core library, about
1.3 MB, not the 4 MB of every Bokeh extension). The output carrying them is
dropped (``LoadedBokehJS.drop``) once the live view is over: BokehJS stays in
the page, and the saved notebook does not carry megabytes of script.
"""

from __future__ import annotations

from typing import Any

JS_MIME = "application/javascript"


class LoadedBokehJS:
    """The cell output that loaded BokehJS; ``drop()`` empties it."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def drop(self) -> None:
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)
            self.handle = None


def loader_js(objs: list[Any]) -> str:
    """The script that loads, into the page, the BokehJS bundles ``objs`` need."""
    from bokeh.embed.bundle import bundle_for_objs_and_resources
    from bokeh.io.notebook import _loading_js
    from bokeh.resources import INLINE

    bundle = bundle_for_objs_and_resources(objs, INLINE)
    return _loading_js(bundle, None, register_mime=False)


def load_bokehjs(objs: list[Any]) -> LoadedBokehJS:
    """Publish the BokehJS loader for ``objs`` in the current cell's output.

    Sent on every live view, not once per kernel: after a page reload the
    kernel cannot tell that the page lost ``window.Bokeh``.
    """
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.display import display

    if not InteractiveShell.initialized():  # a script: no page to load it into
        return LoadedBokehJS(None)
    handle = display({JS_MIME: loader_js(objs)}, raw=True, display_id=True)
    return LoadedBokehJS(handle)
