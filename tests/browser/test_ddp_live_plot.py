"""%ddp_check's live per-rank plot in a real JupyterLab notebook in Debian Chromium.

What a user sees: while two gloo ranks run a 9-second loop (one all_reduce a
second), the live Bokeh plot draws and its points grow; the browser console
stays free of errors (no "Failed to create view for 'BokehView'"); when the
ranks end the report (an iframe) replaces the plot, and it is still there
after the notebook is saved, its kernel shut down and the page reloaded.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_harness import Lab, start_lab, stop_lab

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("TORCHLENS_SCREENSHOTS", "/tmp"))

CELLS = [
    "%load_ext torchlens",
    "import time\n"
    "import torch\n"
    "import torch.distributed as dist\n"
    "\n"
    "def slow_steps(rank, world_size):\n"
    "    t = torch.ones(4)\n"
    "    for _ in range(9):\n"
    "        time.sleep(1)\n"
    "        dist.all_reduce(t)",
    "%ddp_check slow_steps --world-size 2 --backend gloo --steps 1 --timeout 60",
]

# Points drawn by every Bokeh data source on the page (the live plot's sources
# grow with each streamed heartbeat); -1 while BokehJS is absent.
POINTS_JS = """
() => {
  const B = window.Bokeh;
  if (!B || !B.index) return -1;
  let n = 0;
  const seen = new Set();
  const visit = (view) => {
    if (!view || seen.has(view)) return;
    seen.add(view);
    const src = view.model && view.model.data_source;
    if (src && typeof src.get_length === 'function') n += src.get_length() || 0;
    const kids = view.child_views || (view.renderer_views && [...view.renderer_views.values()]) || [];
    for (const k of kids) visit(k);
    if (view.renderer_views) for (const k of view.renderer_views.values()) visit(k);
  };
  const roots = B.index.roots ? [...B.index.roots] : Object.values(B.index);
  for (const r of roots) { visit(r); if (r.all_views) for (const v of r.all_views()) visit(v); }
  return n;
}
"""


def notebook(cells: list[str]) -> dict[str, Any]:
    return {
        "cells": [
            {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {},
             "outputs": [], "source": src}
            for i, src in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                    "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp: Path = tmp_path_factory.mktemp("lab-ddp-live")
    server = start_lab(tmp, extra=["--LabApp.expose_app_in_browser=True"])
    (tmp / "root" / "live.ipynb").write_text(json.dumps(notebook(CELLS)))
    try:
        yield server
    finally:
        stop_lab(server)


def api(lab: Lab, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(
        f"{lab.url}api/{path}", method=method,
        headers={"Authorization": f"token {lab.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    return json.loads(body) if body else None


def wait_kernel_idle(page: Any) -> None:
    page.wait_for_function(
        """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
                   const k = w && w.sessionContext && w.sessionContext.session
                             && w.sessionContext.session.kernel;
                   return k && k.status === 'idle' && k.connectionStatus === 'connected'; }""",
        timeout=120_000,
    )


def run_cell(page: Any, index: int) -> None:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    # no wait for navigations after the click (a cell starts none): that wait is
    # a round trip to a page whose main thread a live view keeps busy
    cell.locator(".jp-InputArea-editor").click(no_wait_after=True)
    page.keyboard.press("Shift+Enter")
    # the prompt turns into [*] or [n]: the keypress reached a connected kernel
    cell.locator(".jp-InputPrompt").filter(has_text="[").filter(
        has_not_text="[ ]").wait_for(timeout=90_000)


def prompt(page: Any, index: int) -> str:
    return page.locator(".jp-Notebook .jp-Cell").nth(index).locator(
        ".jp-InputPrompt").inner_text().strip()


def test_live_plot_draws_while_ranks_run_and_report_survives_reload(
    lab: Lab, chromium: Any
) -> None:
    page = chromium.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{lab.url}lab/tree/live.ipynb?token={lab.token}", timeout=60_000)
        page.locator(".jp-Notebook .jp-Cell").nth(2).wait_for(timeout=60_000)
        wait_kernel_idle(page)
        for i in (0, 1):
            run_cell(page, i)
            page.wait_for_function(
                f"() => /\\[\\d+\\]/.test(document.querySelectorAll('.jp-Notebook .jp-Cell')[{i}]"
                ".querySelector('.jp-InputPrompt').textContent)", timeout=120_000)
        run_cell(page, 2)
        ddp = page.locator(".jp-Notebook .jp-Cell").nth(2)

        # while the ranks run: the plot is drawn and its points grow at least twice
        ddp.locator(".bk-Canvas canvas").first.wait_for(timeout=120_000)
        counts: list[int] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and prompt(page, 2) == "[*]:":
            n = page.evaluate(POINTS_JS)
            if n > 0 and (not counts or n != counts[-1]):
                counts.append(n)
                if len(counts) == 3:
                    page.screenshot(path=str(SHOTS / "ddp-live-running.png"))
            page.wait_for_timeout(400)
        assert len(counts) >= 3 and counts == sorted(counts), counts
        assert not ddp.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']"
                               ).filter(has_text="Failed to create view").count()

        # after the run: the report (an iframe) replaces the plot
        page.wait_for_function(
            "() => /\\[\\d+\\]/.test(document.querySelectorAll('.jp-Notebook .jp-Cell')[2]"
            ".querySelector('.jp-InputPrompt').textContent)", timeout=120_000)
        report = ddp.locator(".jp-OutputArea-output iframe")
        report.wait_for(timeout=30_000)
        frame = ddp.frame_locator(".jp-OutputArea-output iframe")
        frame.locator("text=2 ranks").first.wait_for(timeout=30_000)
        page.screenshot(path=str(SHOTS / "ddp-live-done.png"))
        assert not errors, errors

        # save, shut the kernel down, reload: the saved report is still shown
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function(
            "() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
        saved = json.loads((Path(lab.log).parent / "root" / "live.ipynb").read_text())
        assert any("iframe" in "".join(o.get("data", {}).get("text/html", ""))
                   for o in saved["cells"][2]["outputs"])
        assert not any("application/javascript" in o.get("data", {})
                       for o in saved["cells"][2]["outputs"])  # BokehJS is not saved
        for kernel in api(lab, "kernels"):
            api(lab, f"kernels/{kernel['id']}", "DELETE")
        page.reload(timeout=60_000)
        reopened = page.locator(".jp-Notebook .jp-Cell").nth(2)
        reopened.locator(".jp-OutputArea-output iframe").wait_for(timeout=60_000)
        reopened.frame_locator(".jp-OutputArea-output iframe").locator(
            "text=2 ranks").first.wait_for(timeout=30_000)
        page.screenshot(path=str(SHOTS / "ddp-live-reopened.png"))
    finally:
        page.close()
