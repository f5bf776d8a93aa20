"""The run's store is a signed channel: real gloo ranks, and a forger on the port.

Anyone who can reach the store's port (another user, a leftover rank of an
earlier run) can write to it. These tests play that writer: forged heartbeats,
step batches and a stop during a run are dropped and counted while the run
passes; a forged or unsigned payload is never unpickled; and the run's secret
shows in no process's argv and in no rank's log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

import cloudpickle
import psutil
import pytest
import torch.distributed as dist

from torchlens.capture.channel import protocol
from torchlens.capture.channel.signing import RunKey
from torchlens.capture.ddp import launcher
from torchlens.frontends.ddp.api import ddp_check

from . import buggy, profiled
from .conftest import assert_clean

pytestmark = pytest.mark.usefixtures("no_leftovers")


def _in_thread(fn, **kw):
    """Run ``ddp_check`` in a thread, so the test can act while the ranks run."""
    box: dict = {}

    def target():
        try:
            box["result"] = ddp_check(fn, live=False, **kw)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def _worker_procs(module: str) -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if module in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _wait_for_workers(module: str, n: int, timeout: float = 60.0) -> list[psutil.Process]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        procs = _worker_procs(module)
        if len(procs) >= n:
            return procs
        time.sleep(0.05)
    raise AssertionError(f"{n} workers of {module} did not start")


def _client(port: int):
    raw = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    return dist.PrefixStore(protocol.PREFIX, raw)


def test_forged_messages_during_a_run_are_dropped_counted_and_said(tmp_path):
    thread, box = _in_thread(profiled.balanced, world_size=2, backend="gloo", steps=40,
                             profile=True, profile_every=10, run_dir=str(tmp_path / "run"))
    procs = _wait_for_workers("torchlens.frontends.ranks.rank_side", 2)
    port = int(procs[0].cmdline()[-4])  # HOST PORT RANK WORLD DIR: the port is public
    # ... but only to this machine: the store listens on loopback, not every interface
    listening = {c.laddr.ip for c in psutil.net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    assert listening == {"127.0.0.1"}
    forger = _client(port)
    while not forger.get(protocol.heartbeat_key(0)):  # the ranks are up and beating
        time.sleep(0.05)
    earlier_run = RunKey.new()  # a leftover rank of an earlier run on a reused port
    # a forged count and a forged step batch at the index the rank writes next
    n = forger.add(protocol.steps_count_key(0), 0)
    forger.set(protocol.steps_key(0, n), json.dumps([{"step": 999, "forged": True}]))
    forger.add(protocol.steps_count_key(0), 1)
    # a forged stop behind a forged "a rank is done": must not end the run
    forger.set(protocol.stop_key(), "1")
    forger.add(protocol.done_key(), 1)
    forger.set(protocol.result_key(1), json.dumps({"rank": 1, "forged": True}))
    end = time.monotonic() + 1.5
    i = 0
    while time.monotonic() < end and thread.is_alive():
        hb = {"t": time.time(), "beat": 10_000 + i, "phase": "forged", "rss": 1 << 40}
        try:
            forger.set(protocol.heartbeat_key(1), json.dumps(hb))  # unsigned
            forger.set(protocol.heartbeat_key(0),
                       earlier_run.seal(protocol.heartbeat_key(0), protocol.encode(hb)))
        except dist.DistNetworkError:  # the run ended and closed its store
            break
        i += 1
        time.sleep(0.02)
    thread.join(timeout=240)
    assert not thread.is_alive()
    if "error" in box:
        raise box["error"]
    res = box["result"]
    assert res.records.outcome == "finished", res.records.outcome
    assert res.ok, [i.to_dict() for i in res.failed()]
    steps = res.records.profiling.steps
    assert [len(s) for s in steps] == [40, 40]  # every genuine batch still arrived
    assert not any(r.step == 999 for s in steps for r in s)  # the forged batch's
    assert "forged" not in set(res.memory()["phase"])
    # each rank's own report, not the forged one (which holds a rank and nothing else)
    assert all(r is not None and r.pid and r.steps and r.env_start for r in res.records.ranks)
    assert (res.records.memory_peak[1].rss or 0) < 1 << 40  # no forged figure used
    dropped = res.records.dropped
    assert dropped.get("heartbeat", 0) >= 1 and dropped.get("step batch") == 1
    assert dropped.get("stop") == 1
    item = res.item("signed messages")
    assert item.status == "warning"
    assert "with a bad signature were dropped" in item.evidence
    assert f"port {port}" in item.evidence
    shown = res._repr_mimebundle_()["text/plain"]  # what the notebook shows
    assert "with a bad signature were dropped" in shown
    assert_clean(res)


class _Evil:
    """Unpickling this creates a marker file: proof that the payload was run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("how", ["unsigned", "another key", "no key given"])
def test_a_worker_refuses_a_forged_payload_and_unpickles_nothing(tmp_path, how):
    marker = tmp_path / "pwned"
    evil = cloudpickle.dumps(_Evil(str(marker)))
    key = RunKey.new()
    server = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=30))
    tl = dist.PrefixStore(protocol.PREFIX, server)
    tl.set(protocol.heartbeat_key(0), b"")
    if how == "unsigned":
        tl.set(protocol.PAYLOAD, evil)
    else:  # signed, but not with this run's secret (same run id: a guessed or leaked id)
        tl.set(protocol.PAYLOAD, RunKey(key.run_id, os.urandom(32)).seal(protocol.PAYLOAD, evil))
    env = dict(os.environ, TORCHLENS_SYS_PATH=os.pathsep.join(p for p in sys.path if p),
               OMP_NUM_THREADS="1")
    if how != "no key given":
        env.update(key.env())
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchlens.capture.ddp.worker", "127.0.0.1",
         str(server.port), "0", "1", str(tmp_path)],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert not marker.exists(), "the forged payload was unpickled"
    text = out.decode(errors="replace")
    if how == "no key given":
        assert proc.returncode == 2
        assert "no run key" in text and "refusing to run" in text
        assert not tl.check([protocol.result_key(0)])  # it did not even report
        return
    assert proc.returncode == 1, text
    result = protocol.Channel(tl, key).get(protocol.result_key(0))  # signed by the rank
    assert result is not None, "the rank's report failed its signature"
    err = result["error"]
    assert err["type"] == "PayloadRefused"
    assert "Nothing was unpickled" in err["message"]
    assert ("not signed" if how == "unsigned" else "bad signature") in err["message"]


def test_the_secret_is_in_no_argv_and_no_log(monkeypatch):
    key = RunKey.new()
    monkeypatch.setattr(launcher.RunKey, "new", classmethod(lambda cls: key))
    secret = key.secret.hex()
    thread, box = _in_thread(buggy.prints_environment, world_size=2, steps=1, timeout=30)
    procs = _wait_for_workers("torchlens.capture.ddp.worker", 2)
    log_dir = procs[0].cmdline()[-1]
    seen = 0
    while thread.is_alive():
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmdline = fh.read()
            except OSError:  # ended, or not ours to read
                continue
            assert secret.encode() not in cmdline, f"the secret is in the argv of pid {pid}"
            seen += 1
        for name in os.listdir(log_dir) if os.path.isdir(log_dir) else []:
            with open(os.path.join(log_dir, name), "rb") as fh:
                assert secret.encode() not in fh.read(), f"the secret is in {name}"
        time.sleep(0.1)
    if "error" in box:
        raise box["error"]
    res = box["result"]
    assert res.ok and seen > 0
    logs = [r.log for r in res.records.ranks]
    assert all("MASTER_PORT" in log for log in logs)  # the environment was printed...
    assert not any(secret in log for log in logs)  # ...without the secret
    assert all(key.run_id in log for log in logs)  # (the run id is public)
    assert_clean(res)


def test_memory_of_a_run_without_a_genuine_heartbeat_is_empty_not_an_error():
    # forged heartbeats can hide every genuine one of a short run
    from types import SimpleNamespace

    from torchlens.frontends.ddp.api import DdpResult

    res = object.__new__(DdpResult)
    res._profile = SimpleNamespace(tables={})
    frame = res.memory()
    assert len(frame) == 0 and "phase" in frame.columns
