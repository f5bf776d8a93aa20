"""%ddp_check --nnodes: two torch elastic agents on this machine as two nodes.

The kernel's side (``ddp_check``) starts node 0's agent and hands over the
command for the other nodes; the test starts node 1 with it, as a user would
on another machine (``TORCHLENS_RUN_SECRET_FILE``, no secret in argv).
World size 4 (2 nodes x 2 ranks), gloo on CPU, c10d rendezvous on a free port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess

import psutil
import pytest

from torchlens.frontends.ddp.api import ddp_check
from torchlens.model import InputError
from torchlens.model.messages import DdpHeartbeat

from . import buggy
from .conftest import assert_clean

pytestmark = pytest.mark.usefixtures("no_leftovers")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OtherNode:
    """Starts node 1 with the printed command; checks argv for the secret while it runs."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}

    def __call__(self, argv: list[str], env: dict[str, str]) -> None:
        self.env = env
        assert "TORCHLENS_RUN_SECRET" not in env  # the file, not the value
        self.proc = subprocess.Popen(argv, env={**os.environ, **env},
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def end(self) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
            raise AssertionError("node 1's agent did not end with the run") from None


def run_two_nodes(fn, **kw):
    node1 = OtherNode()
    try:
        result = ddp_check(fn, nnodes=2, nproc_per_node=2,
                           rdzv_endpoint=f"127.0.0.1:{free_port()}", steps=1, timeout=30,
                           live=False, on_other_nodes=node1, **kw)
    finally:
        node1.end()
    assert_clean(result)
    for res in result.records.ranks:  # the ranks are the agents' children, not ours
        if res is not None and res.pid:
            assert not psutil.pid_exists(res.pid) or psutil.Process(
                res.pid).status() == psutil.STATUS_ZOMBIE, f"rank pid {res.pid} alive"
    return result, node1


def test_two_nodes_correct_step_passes_every_check():
    result, node1 = run_two_nodes(buggy.correct_step)
    status = {i.name: i.status for i in result.checklist}
    assert all(s in ("passed", "not applicable") for s in status.values()), result.checklist
    assert status["collective sequence"] == "passed"
    assert status["communication"] == "passed"
    assert status["parameter sync"] == "passed"
    assert result.records.world_size == 4
    ranks = result.records.ranks
    assert [r.rank for r in ranks] == [0, 1, 2, 3]
    assert sorted(r.node for r in ranks) == [0, 0, 1, 1]
    assert [r.local_rank for r in ranks] == [0, 1, 0, 1]
    nodes = result.records.nodes
    assert [w.node for w in nodes.ranks] == [0, 0, 1, 1]
    assert "(node 1" in result.records.where(3)
    heartbeats = result.memory()
    assert set(heartbeats["rank"]) == {0, 1, 2, 3}
    assert node1.proc.returncode == 0


def test_two_nodes_mismatch_named_with_node_and_rank():
    result, _ = run_two_nodes(buggy.last_rank_diverges)
    assert not result.ok
    seq = result.item("collective sequence")
    assert seq.status == "failed"
    assert "rank 3 (node 1, host " in seq.evidence, seq.evidence
    assert "broadcast" in seq.evidence


def test_secret_in_no_cmdline(monkeypatch):
    seen: list[str] = []
    node1 = OtherNode()

    def start_and_look(argv, env):
        node1(argv, env)
        with open(env["TORCHLENS_RUN_SECRET_FILE"]) as fh:
            seen.append(fh.read().strip())
        assert oct(os.stat(env["TORCHLENS_RUN_SECRET_FILE"]).st_mode & 0o777) == "0o600"

    def step_and_look(rank, world_size):
        import time
        time.sleep(1.0)  # every agent and rank is up meanwhile
        return buggy.correct_step(rank, world_size)

    import threading

    cmdlines: list[bytes] = []
    stop = threading.Event()

    def scan():
        while not stop.is_set():
            for p in psutil.process_iter():
                with contextlib.suppress(psutil.Error, OSError):
                    with open(f"/proc/{p.pid}/cmdline", "rb") as fh:
                        cmdlines.append(fh.read())
            stop.wait(0.3)

    t = threading.Thread(target=scan, daemon=True)
    t.start()
    try:
        result = ddp_check(step_and_look, nnodes=2, nproc_per_node=2,
                           rdzv_endpoint=f"127.0.0.1:{free_port()}", steps=1, timeout=30,
                           live=False, on_other_nodes=start_and_look)
    finally:
        stop.set()
        t.join()
        node1.end()
    assert result.ok, result.checklist
    assert seen and len(seen[0]) == 64
    assert any(b"torchlens.capture.ddp.worker" in c for c in cmdlines)  # the scan saw ranks
    assert not any(seen[0].encode() in c for c in cmdlines)


@pytest.mark.parametrize("kw, words", [
    ({"nproc_per_node": 2}, "add --nnodes"),
    ({"nnodes": 2, "rdzv_endpoint": "127.0.0.1:29400"}, "nproc_per_node"),
    ({"nnodes": 2, "nproc_per_node": 2, "rdzv_endpoint": "nohost"}, "HOST:PORT"),
    ({"nnodes": 2, "nproc_per_node": 2, "rdzv_endpoint": "h:99999"}, "1 to 65535"),
    ({"nnodes": 2, "nproc_per_node": 2, "rdzv_endpoint": "h:29400", "strict": True}, "--strict"),
    ({"nnodes": 2, "nproc_per_node": 2, "rdzv_endpoint": "h:29400", "host": "no-such-if0"},
     "interface"),
])
def test_bad_node_options_start_nothing(kw, words):
    with pytest.raises(InputError, match=words):
        ddp_check(buggy.correct_step, live=False, **kw)


def test_live_lanes_name_the_node():
    from torchlens.render.ddp.heartbeats import LivePlot

    plot = LivePlot(4)
    for r in range(4):
        plot.push(DdpHeartbeat(rank=r, t_rel=0.1 * r, phase="init", node=r // 2, host="h"))
    plot.flush(force=True)
    labels = plot.layout.children[2].yaxis.major_label_overrides
    assert labels[3] == "rank 3 (node 1)" and labels[0] == "rank 0 (node 0)"
