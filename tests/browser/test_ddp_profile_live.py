"""``%ddp_check --profile``'s live view in a real JupyterLab notebook in Debian Chromium.

What a user sees: while two gloo ranks train (rank 1 with a slow input
pipeline), one live view draws, and every panel's points grow: step times,
memory, fragmentation, the joint timeline, the breakdown; the verdict names
rank 1. The browser console stays free of errors. When the ranks end the
report replaces the view, with the profiling section, and it is still there
after the notebook is saved, its kernel shut down and the page reloaded.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_harness import Lab, start_lab, stop_lab
from test_ddp_live_plot import api, notebook, prompt, run_cell, wait_kernel_idle

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("TORCHLENS_SCREENSHOTS", "/tmp"))

CELLS = [
    "%load_ext torchlens",
    "import time, torch, torchlens\n"
    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "\n"
    "class Samples(torch.utils.data.Dataset):\n"
    "    def __init__(self, sleep_s): self.sleep_s = sleep_s\n"
    "    def __len__(self): return 1 << 20\n"
    "    def __getitem__(self, i):\n"
    "        time.sleep(self.sleep_s)\n"
    "        return torch.randn(32), torch.randint(0, 4, ())\n"
    "\n"
    "def train(rank, world_size, steps):\n"
    "    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))\n"
    "    opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "    data = torch.utils.data.DataLoader(Samples(0.01 if rank == 1 else 0.0), batch_size=4)\n"
    "    for i, (x, y) in enumerate(data):\n"
    "        if i == steps: break\n"
    "        opt.zero_grad()\n"
    "        torch.nn.functional.cross_entropy(model(x), y).backward()\n"
    "        opt.step()\n"
    "        torchlens.step()",
    "%ddp_check train --world-size 2 --backend gloo --profile --steps 300 --profile-every 10 "
    "--run-dir run1 --timeout 60",
]

# Points per panel: each Bokeh plot's title -> rows of the data sources its
# renderers draw (a panel without a title counts under its parent's).
PANEL_POINTS_JS = """
() => {
  const B = window.Bokeh;
  if (!B || !B.index) return null;
  const out = {};
  const seen = new Set();
  const visit = (view, title) => {
    if (!view || seen.has(view)) return;
    seen.add(view);
    const m = view.model;
    let t = title;
    if (m && m.title && typeof m.title.text === 'string' && m.title.text) t = m.title.text;
    const src = m && m.data_source;
    if (src && typeof src.get_length === 'function') out[t] = (out[t] || 0) + (src.get_length() || 0);
    const kids = [...(view.child_views || [])];
    if (view.renderer_views) kids.push(...view.renderer_views.values());
    for (const k of kids) visit(k, t);
  };
  const roots = B.index.roots ? [...B.index.roots] : Object.values(B.index);
  for (const r of roots) visit(r, 'root');
  return out;
}
"""


# The text of every Bokeh Div on the page (Bokeh draws them in a shadow DOM,
# which the page's innerText does not reach).
DIV_TEXT_JS = """
() => {
  const B = window.Bokeh;
  if (!B || !B.index) return '';
  const texts = [];
  const seen = new Set();
  const visit = (view) => {
    if (!view || seen.has(view)) return;
    seen.add(view);
    if (view.model && typeof view.model.text === 'string') texts.push(view.el ? view.el.shadowRoot ? view.el.shadowRoot.textContent : view.el.textContent : view.model.text);
    for (const k of (view.child_views || [])) visit(k);
  };
  const roots = B.index.roots ? [...B.index.roots] : Object.values(B.index);
  for (const r of roots) visit(r);
  return texts.join(' | ');
}
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp: Path = tmp_path_factory.mktemp("lab-ddp-profile")
    server = start_lab(tmp, extra=["--LabApp.expose_app_in_browser=True"])
    (tmp / "root" / "profile.ipynb").write_text(json.dumps(notebook(CELLS)))
    try:
        yield server
    finally:
        stop_lab(server)


def test_profile_view_draws_every_panel_live_and_the_report_survives_reload(
    lab: Lab, chromium: Any
) -> None:
    page = chromium.new_page()
    page.set_viewport_size({"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{lab.url}lab/tree/profile.ipynb?token={lab.token}", timeout=60_000)
        page.locator(".jp-Notebook .jp-Cell").nth(2).wait_for(timeout=60_000)
        wait_kernel_idle(page)
        for i in (0, 1):
            run_cell(page, i)
            page.wait_for_function(
                f"() => /\\[\\d+\\]/.test(document.querySelectorAll('.jp-Notebook .jp-Cell')[{i}]"
                ".querySelector('.jp-InputPrompt').textContent)", timeout=120_000)
        run_cell(page, 2)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(2)
        cell.locator(".bk-Canvas canvas").first.wait_for(timeout=120_000)

        snapshots: list[dict[str, int]] = []
        verdicts: list[str] = []
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and prompt(page, 2) == "[*]:":
            counts = page.evaluate(PANEL_POINTS_JS) or {}
            if counts and (not snapshots or counts != snapshots[-1]):
                snapshots.append(counts)
                verdicts.append(page.evaluate(DIV_TEXT_JS))
                if len(snapshots) in (4, 8):
                    cell.screenshot(path=str(SHOTS / f"ddp-profile-live-{len(snapshots)}.png"))
            page.wait_for_timeout(500)
        assert len(snapshots) >= 3, snapshots
        first, last = snapshots[0], snapshots[-1]
        panels = [t for t in last if t != "root"]
        grew = [t for t in panels if last[t] > first.get(t, 0)]
        # step time, memory, fragmentation/largest free, timeline, breakdown: all grew
        assert len(grew) >= 5, (first, last)
        assert any("rank 1" in v for v in verdicts), verdicts[-1][:500]
        assert not errors, errors

        # after the run: the report replaces the view, with the profiling section
        page.wait_for_function(
            "() => /\\[\\d+\\]/.test(document.querySelectorAll('.jp-Notebook .jp-Cell')[2]"
            ".querySelector('.jp-InputPrompt').textContent)", timeout=180_000)
        cell.locator(".jp-OutputArea-output iframe").wait_for(timeout=30_000)
        frame = cell.frame_locator(".jp-OutputArea-output iframe")
        frame.locator("text=Per-rank steps, memory and timeline").first.wait_for(timeout=30_000)
        frame.locator("text=slow rank").first.wait_for(timeout=30_000)
        cell.screenshot(path=str(SHOTS / "ddp-profile-live-done.png"))
        assert not errors, errors

        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function(
            "() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
        for kernel in api(lab, "kernels"):
            api(lab, f"kernels/{kernel['id']}", "DELETE")
        page.reload(timeout=60_000)
        reopened = page.locator(".jp-Notebook .jp-Cell").nth(2)
        reopened.locator(".jp-OutputArea-output iframe").wait_for(timeout=60_000)
        reopened.frame_locator(".jp-OutputArea-output iframe").locator(
            "text=Per-rank steps, memory and timeline").first.wait_for(timeout=30_000)
        page.screenshot(path=str(SHOTS / "ddp-profile-live-reopened.png"))
    finally:
        page.close()
