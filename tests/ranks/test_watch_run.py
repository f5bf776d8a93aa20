"""``torchlens.watch`` on a real ``torchlens run -- torchrun`` job (CPU, gloo, two ranks).

One watcher on the run folder, one on the collector's address (with the
run's secret file), started while the job runs; a third joins late after a
frame in the store was replaced by a forged one. What is checked is what a
user sees: the view's Bokeh sources (both ranks' step numbers, increasing),
its verdict and status rows (rank 1 slow), and how the watch ended.
"""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

import torchlens
from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey
from torchlens.capture.ranks.feed import KEEP_FRAMES

from .helpers import Collector, free_port, report, torchrun_args

pytestmark = pytest.mark.timeout(400)
STEPS = 60


def _until(check, timeout: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _steps(w) -> list[list[int]]:
    return [list(src.data["step"]) for src in w.view.profile.panels.steps]


def test_watch_a_running_job_on_its_folder_and_its_address(tmp_path: Path) -> None:
    out = tmp_path / "run"
    c = Collector(out, torchrun_args(1, 2, free_port()), TL_STEPS=str(STEPS),
                  TL_SLOW_S="0.04", TL_STEP_SLEEP="0.1")
    watchers = []
    try:
        line = c.wait_line("torchlens run: run")
        run_id, address = re.search(r"run (\w+), collector (\S+),", line).groups()
        on_dir = torchlens.watch(str(out), timeout=120)
        on_port = torchlens.watch(address, secret_file=str(out / "run.secret"), timeout=120)
        watchers += [on_dir, on_port]
        assert run_id in on_port.label
        # while the job runs, both views fill with both ranks' steps
        for w in watchers:
            _until(lambda w=w: w.view is not None and all(len(s) >= 10 for s in _steps(w)),
                   what=f"steps in {w.label}")
        assert c.proc.poll() is None, "the job should still be running"
        assert on_dir.state == on_port.state == "running", (on_dir, on_port)
        # the store holds a bounded feed
        store = dist.TCPStore(address.split(":")[0], int(address.split(":")[1]),
                              is_master=False, timeout=timedelta(seconds=10))
        key = RunKey(run_id, bytes.fromhex((out / "run.secret").read_text()))
        newest = protocol.Channel(store, key).get(protocol.live_count_key(run_id))
        assert isinstance(newest, int)
        held = [i for i in range(newest + 1)
                if store.check([protocol.live_key(run_id, i)])]
        assert 0 < len(held) <= KEEP_FRAMES and held[-1] == newest
        # a forged frame: a late watcher drops and counts it, and reads the rest
        # (forged once the watcher on the address has read it: it would drop it too)
        _until(lambda: (on_port.seq or -1) >= newest, what="the address watcher's frames")
        name = protocol.live_key(run_id, newest)
        store.set(name, RunKey(run_id, b"y" * 32).seal(name, b'{"format": "torchlens-live-frame"}'))
        late = torchlens.watch(address, secret_file=str(out / "run.secret"), timeout=120)
        watchers.append(late)
        _until(lambda: late.frames > 0, what="the late watcher's frames")
        assert late.dropped == 1, late
        assert c.wait() == 0, c.output
        for w in watchers:  # each stops by itself at the run's last frame
            assert w.wait(30), (w, w.message)
    finally:
        for w in watchers:
            w.stop()
        c.kill()
    manifest = json.loads((out / "manifest.json").read_text())
    for w in (on_dir, on_port):
        assert w.state == "ended", (w, w.message)  # the store watcher saw the last frame too
        shown = _steps(w)
        assert shown[0] == shown[1] == list(range(STEPS)), shown  # every step, in order
        assert "rank 1 is the slow rank" in w.status.verdict, (w, c.output)
        assert [(r.rank, r.state, r.slow) for r in w.status.ranks] == [
            (0, "finished", False), (1, "finished", True)], w.status
        # said once, in the status block: not again above the step chart
        assert not w.view.profile.panels.verdict.visible
        assert w.dropped == 0
    assert late.state == "ended" and late.dropped == 1, (late, late.message)
    # the feed stays in the folder, the manifest says so, and the report still works
    assert manifest["live"]["feed"] == "live.jsonl" and manifest["live"]["frames"] > 3
    status = json.loads((out / "live.json").read_text())
    assert status["ended"] is True and status["run_id"] == run_id
    assert not (out / ".spool").exists()
    _, page = report(out, tmp_path)
    assert "rank 1 is the slow rank" in page and "live.json" not in page
    # and a watch of the finished folder replays it to the same final state
    again = torchlens.watch(out, timeout=30)
    assert again.wait(60) and _steps(again)[1] == list(range(STEPS))
