"""``torchlens.watch(RUN_DIR)`` in a real JupyterLab notebook in Debian Chromium.

What a user sees: a real ``torchlens run -- torchrun`` job (two gloo ranks on
the CPU, rank 1 with a slow input pipeline) runs in the background; a cell
``torchlens.watch(RUN_DIR)`` shows the live view, whose step-time panel gains
points for both ranks while the job runs, with the status block naming rank
1 as the straggler; the kernel stays free (another cell runs meanwhile); when
the job ends the block says so, and the final status is still there after
the notebook is saved, its kernel shut down and the page reloaded. The
browser console stays free of errors.
Screenshots go to ``$TORCHLENS_SCREENSHOTS`` (default /tmp).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab_harness import Lab, start_lab, stop_lab
from test_ddp_live_plot import api, notebook, prompt, run_cell, wait_kernel_idle
from test_ddp_profile_live import PANEL_POINTS_JS

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("TORCHLENS_SCREENSHOTS", "/tmp"))
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "ranks" / "train_script.py"
STEP_PANEL = "Step time per rank (ms)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_job(out: Path, log: Path) -> subprocess.Popen[bytes]:
    """``torchlens run`` of a two-rank torchrun job, about a minute of steps (long
    enough for the watch to draw it growing on a loaded machine)."""
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "PATH": f"{bindir}:{os.environ.get('PATH', '')}", "TORCH_CPP_LOG_LEVEL": "ERROR",
           "TL_STEPS": "500", "TL_SLOW_S": "0.04", "TL_STEP_SLEEP": "0.08"}
    port = _free_port()
    cmd = [sys.executable, "-m", "torchlens", "run", "--out", str(out), "--",
           str(bindir / "torchrun"), "--nnodes", "1", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
           "--rdzv-id", f"watch{port}", str(SCRIPT)]
    with log.open("wb") as fh:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, Path]]:
    tmp: Path = tmp_path_factory.mktemp("lab-watch")
    run_dir = tmp / "run"
    server = start_lab(tmp, extra=["--LabApp.expose_app_in_browser=True"])
    cells = ["import torchlens", f"w = torchlens.watch({str(run_dir)!r}, timeout=120)\nw",
             "sum(range(10))"]
    (tmp / "root" / "watch.ipynb").write_text(json.dumps(notebook(cells)))
    try:
        yield server, run_dir
    finally:
        stop_lab(server)


def _wait_prompt(page: Any, index: int) -> None:
    page.wait_for_function(
        f"() => /\\[\\d+\\]/.test(document.querySelectorAll('.jp-Notebook .jp-Cell')[{index}]"
        ".querySelector('.jp-InputPrompt').textContent)", timeout=120_000)


def test_watch_draws_a_running_job_and_its_end(lab: tuple[Lab, Path], chromium: Any) -> None:
    server, run_dir = lab
    page = chromium.new_page()
    page.set_viewport_size({"width": 1400, "height": 3200})  # the whole view in one shot
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    job: subprocess.Popen[bytes] | None = None
    try:
        page.goto(f"{server.url}lab/tree/watch.ipynb?token={server.token}", timeout=60_000)
        page.locator(".jp-Notebook .jp-Cell").nth(2).wait_for(timeout=60_000)
        wait_kernel_idle(page)
        run_cell(page, 0)
        _wait_prompt(page, 0)
        # the job starts once the kernel has torchlens imported: on a loaded
        # machine the page, the kernel and the import took longer than the job
        job = _start_job(run_dir, run_dir.parent / "job.log")
        while not (run_dir / ".spool").exists():  # the job's folder is there
            assert job.poll() is None, (run_dir.parent / "job.log").read_text()
            time.sleep(0.2)
        run_cell(page, 1)
        _wait_prompt(page, 1)  # watch() returns at once: the drawing is in the background
        cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
        cell.locator(".bk-Canvas canvas").first.wait_for(timeout=120_000)
        run_cell(page, 2)  # the kernel stays free while the view updates
        _wait_prompt(page, 2)

        counts: list[int] = []
        shot = None
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and job.poll() is None:
            n = (page.evaluate(PANEL_POINTS_JS) or {}).get(STEP_PANEL, 0)
            if not counts or n != counts[-1]:
                counts.append(n)
            if shot is None and n >= 200 and "slow rank" in cell.inner_text():
                shot = SHOTS / "watch-live-running.png"
                # the page at the cell's box: an element screenshot waits for the
                # element to stand still, and a view redrawn twice a second on a
                # loaded machine never did within its timeout
                page.screenshot(path=str(shot), clip=cell.bounding_box())
            page.wait_for_timeout(500)
        assert job.wait(timeout=120) == 0, (run_dir.parent / "job.log").read_text()
        assert len(counts) >= 3 and counts[-1] > counts[0], counts  # it grew while running
        assert shot is not None, counts
        # the end: the block says so; every step of both ranks is drawn
        cell.get_by_text("ended", exact=True).first.wait_for(timeout=60_000)
        page.wait_for_timeout(1000)
        final = (page.evaluate(PANEL_POINTS_JS) or {}).get(STEP_PANEL, 0)
        assert final >= 2 * 250, final  # two lines of 250 steps (+ profiled-step circles)
        text = cell.inner_text()
        assert "rank 1 is the slow rank" in text and "finished" in text, text[:2000]
        cell.screenshot(path=str(SHOTS / "watch-live-ended.png"))
        assert not errors, errors
        assert prompt(page, 2).startswith("[")

        # the saved notebook keeps the final status (widgets are not saved)
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function(
            "() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
        for kernel in api(server, "kernels"):
            api(server, f"kernels/{kernel['id']}", "DELETE")
        page.reload(timeout=60_000)
        reopened = page.locator(".jp-Notebook .jp-Cell").nth(1)
        reopened.get_by_text("kept when the notebook is saved").first.wait_for(timeout=60_000)
        assert "rank 1 is the slow rank" in reopened.inner_text()
        reopened.screenshot(path=str(SHOTS / "watch-live-reopened.png"))
    finally:
        page.close()
        if job is not None and job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait(timeout=10)
