"""``torchlens run`` against a local user without the run's secret, on real
2-rank gloo jobs: what that user can write to the collector's store (the
unsigned ``slots`` counter, a genuine heartbeat set again) must neither hide
the ranks nor keep a stopped rank alive, and a rank stopped for seconds
(``kill -STOP``, then ``-CONT``) is named in the run's last words."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import torch.distributed as dist

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import MAC_BYTES, MAGIC

from .helpers import Collector, processes_of_run, torchrun_args

pytestmark = pytest.mark.timeout(180)


def _attacker(run: Collector) -> tuple[str, dist.TCPStore]:
    """The run id and a store client, from what ``torchlens run`` printed (as a
    local user reads it: the port is open to every local process)."""
    line = run.wait_line("torchlens run: run ")
    m = re.match(r"torchlens run: run (\w+), collector ([\w.]+):(\d+),", line)
    assert m, line
    store = dist.TCPStore(m[2], int(m[3]), is_master=False, timeout=timedelta(seconds=30))
    return m[1], store


def _body(value: bytes) -> dict:
    """A sealed value's JSON, read without the secret (sealing signs, it does not hide)."""
    return json.loads(bytes(value)[len(MAGIC) + MAC_BYTES:])


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_a_moved_slots_counter_neither_hides_the_ranks_nor_grows_the_collector(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = Collector(out, torchrun_args(1, 2, _port()), TL_STEPS="30", TL_SLOW_S="0.01")
    peak = [0]
    done = threading.Event()

    def watch_rss() -> None:
        proc = psutil.Process(run.proc.pid)
        while not done.is_set():
            try:
                peak[0] = max(peak[0], proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(0.2)

    try:
        run_id, store = _attacker(run)
        threading.Thread(target=watch_rss, daemon=True).start()
        # before the ranks attach (torchrun still starts them)
        store.add(protocol.slots_key(run_id), 300)
        store.add(protocol.slots_key(run_id), 2 * 10**7)
        code = run.wait(150)
    finally:
        done.set()
        run.kill()
    output = run.output
    assert code == 0, output
    m = re.search(r"torchlens run: finished: every rank said goodbye \((\d+) steps", output)
    assert m and int(m[1]) >= 25, output
    # (the old collector ended with "the command ended: no rank attached, no step recorded")
    manifest = _manifest(out)
    assert [r["state"] for r in manifest["ranks"]] == ["finished", "finished"], manifest
    assert all(r["steps"] >= 25 for r in manifest["ranks"]), manifest["ranks"]
    assert manifest["dropped_messages"] == 0, manifest["dropped_why"]
    # the old collector grew a list of 2*10^7 slots to look for: over 1 GB
    assert peak[0] < 800 << 20, peak[0]


def test_a_rank_stopped_for_seconds_is_named_though_its_old_heartbeat_is_replayed(
        tmp_path: Path) -> None:
    """``kill -STOP`` of rank 1 for 8 s while someone sets one of its genuine
    older heartbeats again and again: the replays are dropped, the spell is
    measured, and the run's last words and manifest name it."""
    out = tmp_path / "run"
    run = Collector(out, torchrun_args(1, 2, _port()), TL_STEPS="70", TL_STEP_SLEEP="0.1",
                    TL_SLOW_S="0")
    try:
        run_id, store = _attacker(run)
        roster = protocol.roster_key(run_id, 1)
        deadline = time.monotonic() + 90
        while not store.check([roster]):
            assert time.monotonic() < deadline, run.output
            time.sleep(0.2)
        slot = _body(store.get(roster))["slots"][-1]
        hb = protocol.slot_key(run_id, slot, "hb")
        old = bytes(store.get(hb))  # a genuine heartbeat, soon an old one
        while (_body(store.get(hb)).get("steps_done") or 0) < 5:
            assert time.monotonic() < deadline, run.output
            time.sleep(0.1)
        time.sleep(1.0)  # the collector has read that heartbeat (a poll is 0.25 s)
        rank1 = [p for p in processes_of_run(run_id)
                 if p.environ().get("RANK") == "1" and "LOCAL_RANK" in p.environ()]
        assert len(rank1) == 1, rank1
        os.kill(rank1[0].pid, signal.SIGSTOP)
        try:
            stop = time.monotonic()
            while time.monotonic() - stop < 8.0:
                store.set(hb, old)  # the replay
                time.sleep(0.3)
        finally:
            os.kill(rank1[0].pid, signal.SIGCONT)
        code = run.wait(150)
    finally:
        run.kill()
    output = run.output
    assert code == 0, output
    said = re.compile(r"rank 1 went silent for (\d+\.\d) s at step (\d+); "
                      r"the others waited for it")
    last = [line for line in output.splitlines() if line.startswith("torchlens run: finished")]
    assert last and said.search(last[0]), output
    m = said.search(last[0])
    assert 7.5 <= float(m[1]) <= 15 and int(m[2]) >= 5, last[0]
    manifest = _manifest(out)
    assert said.search(manifest["stopped"]) and said.search(manifest["verdict"]), manifest
    assert manifest["verdict_code"] == "silent_rank"
    assert manifest["dropped_why"].get("replayed", 0) >= 1, manifest["dropped_why"]
    assert re.search(r"torchlens run: dropped \d+: .*\d+ replayed", output), output
    assert [r["state"] for r in manifest["ranks"]] == ["finished", "finished"]
    assert all(r["steps"] >= 60 for r in manifest["ranks"]), manifest["ranks"]


def _port() -> int:
    from .helpers import free_port

    return free_port()
