"""Scratch: the first watch of a fresh kernel on a job already running (not a test)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from lab_harness import start_lab, stop_lab
from test_ddp_live_plot import notebook, run_cell, wait_kernel_idle
from test_ddp_profile_live import PANEL_POINTS_JS
from test_watch_live import STEP_PANEL, _start_job, _wait_prompt

RANGES_JS = """
() => {
  const B = window.Bokeh; if (!B || !B.index) return null;
  const out = [];
  const seen = new Set();
  const visit = (view) => {
    if (!view || seen.has(view)) return; seen.add(view);
    const m = view.model;
    if (m && m.x_range && m.y_range && m.title && m.title.text)
      out.push([m.title.text, m.x_range.start, m.x_range.end, m.y_range.start, m.y_range.end]);
    for (const k of [...(view.child_views || [])]) visit(k);
  };
  for (const r of (B.index.roots ? [...B.index.roots] : Object.values(B.index))) visit(r);
  return out;
}
"""


@pytest.mark.parametrize("attempt", range(int(os.environ.get("REPRO_N", "3"))))
def test_first_watch(tmp_path: Path, chromium, attempt: int) -> None:
    run_dir = tmp_path / "run"
    server = start_lab(tmp_path, extra=["--LabApp.expose_app_in_browser=True"])
    cells = [f"import torchlens\nw = torchlens.watch({str(run_dir)!r}, timeout=120)\nw",
             "sum(range(10))"]
    (tmp_path / "root" / "w.ipynb").write_text(json.dumps(notebook(cells)))
    page = chromium.new_page()
    page.set_viewport_size({"width": 1400, "height": 3200})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    job = _start_job(run_dir, tmp_path / "job.log")
    try:
        while not (run_dir / ".spool").exists():
            time.sleep(0.2)
        time.sleep(3)
        page.goto(f"{server.url}lab/tree/w.ipynb?token={server.token}", timeout=60_000)
        page.locator(".jp-Notebook .jp-Cell").nth(1).wait_for(timeout=60_000)
        wait_kernel_idle(page)
        run_cell(page, 0)
        _wait_prompt(page, 0)
        cell = page.locator(".jp-Notebook .jp-Cell").nth(0)
        log = []
        for i in range(40):
            n = (page.evaluate(PANEL_POINTS_JS) or {}).get(STEP_PANEL, 0)
            rng = page.evaluate(RANGES_JS)
            log.append((round(time.monotonic()), n, rng[:2] if rng else rng))
            if i in (6, 20):
                page.screenshot(path=f"/tmp/wrepro/a{attempt}-{i}.png", clip=cell.bounding_box())
            page.wait_for_timeout(1000)
        Path(f"/tmp/wrepro/a{attempt}.log").write_text(
            "\n".join(map(str, log)) + "\nERRORS\n" + "\n".join(errors))
    finally:
        page.close()
        if job.poll() is None:
            os.killpg(job.pid, 9)
        stop_lab(server)
