"""A real ``torchlens run`` registers itself for the sidebar while it runs, and marks
its entry ended when it ends (the sidebar lists it as finished a while).

CPU torchrun jobs (gloo) as in test_torchlens_run.py, with a temporary
registry (``TORCHLENS_RUNS_DIR``).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest

from torchlens.frontends.ranks import registry as reg

from .helpers import Collector, free_port, processes_of_run, torchrun_args

pytestmark = pytest.mark.timeout(300)


def _wait_entry(registry: Path, c: Collector, timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(registry.glob("*.json")) if registry.is_dir() else []
        if found:
            return found[0]
        assert c.proc.poll() is None, c.output
        time.sleep(0.1)
    raise AssertionError(f"no registry entry in {registry}:\n{c.output}")


def test_entry_exists_while_the_run_lasts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    registry, out = tmp_path / "registry", tmp_path / "run"
    monkeypatch.setenv(reg.ENV_DIR, str(registry))
    command = torchrun_args(1, 2, free_port())
    c = Collector(out, command, TL_STEPS="40", TL_STEP_SLEEP="0.1",
                  TORCHLENS_RUNS_DIR=str(registry))
    try:
        path = _wait_entry(registry, c)
        assert stat.S_IMODE(registry.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        entry = json.loads(path.read_text())
        assert entry["pid"] == c.proc.pid and entry["run_dir"] == str(out)
        assert entry["command"] == command
        assert path.name == f"{entry['run_id']}.json"
        assert c.wait_line("torchlens run: run").startswith(
            f"torchlens run: run {entry['run_id']},")
        assert "secret" not in path.read_text().lower()
        (run,) = reg.live_runs()
        assert run["run_id"] == entry["run_id"]
        # "running" once torchlens run writes live.json, else "starting"
        assert run["state"] in ("starting", "running")
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    # ended: no longer a live run, but listed as finished (with its verdict) a while
    assert reg.live_runs() == [] and json.loads(path.read_text())["ended"] > 0
    (done,) = reg.finished_runs()
    assert done["run_id"] == entry["run_id"] and done["state"] == "ended"
    assert done["live"]["ended"] is True and done["live"]["verdict_code"]
    assert done["stopped"]
    assert (out / "manifest.json").exists()


def test_killed_run_leaves_a_stale_entry_that_is_ignored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry, out = tmp_path / "registry", tmp_path / "run"
    monkeypatch.setenv(reg.ENV_DIR, str(registry))
    c = Collector(out, torchrun_args(1, 2, free_port()), TL_STEPS="400",
                  TL_STEP_SLEEP="0.1", TORCHLENS_RUNS_DIR=str(registry))
    run_id = ""
    try:
        path = _wait_entry(registry, c)
        run_id = json.loads(path.read_text())["run_id"]
        assert [r["run_id"] for r in reg.live_runs()] == [run_id]
        os.kill(c.proc.pid, signal.SIGKILL)  # no finally-block runs: the entry stays
        c.proc.wait(timeout=30)
        assert path.exists()
        assert reg.live_runs() == [] and not path.exists()
    finally:
        c.kill()
        # torchrun runs in a session of its own: end the job this test started
        for p in processes_of_run(run_id) if run_id else []:
            p.kill()
