"""``torchlens run -- torchrun ...`` for real: one node, two nodes on localhost, a lost node.

Each test starts real torchrun agents (CPU, gloo); expected figures come
from the run folder's own files read with json, not from torchlens.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from torchlens.formats.run_folder.records import read_steps

from .helpers import (
    REPO,
    Collector,
    cmdlines,
    env,
    free_port,
    other_node_env,
    processes_of_run,
    report,
    torchrun_args,
)

pytestmark = pytest.mark.timeout(400)


def _steps(run_dir: Path, rank: int) -> list[dict]:
    """The rank's steps in its steps.jsonl. A rank attaches at start, so a
    set-up that outlasts the first window is in the file as a window record
    (``"window": true``), which every reader of torchlens leaves out."""
    with open(run_dir / f"rank{rank}" / "steps.jsonl", encoding="utf-8") as fh:
        return [rec for line in fh if not (rec := json.loads(line)).get("window")]


def _run_id(c: Collector) -> str:
    return re.search(r"torchlens run: run (\w+),", c.wait_line("torchlens run: run")).group(1)


def test_straggler_one_node(tmp_path: Path) -> None:
    out = tmp_path / "run"
    c = Collector(out, torchrun_args(1, 2, free_port()), TL_STEPS="30", TL_SLOW_S="0.04")
    try:
        run_id = _run_id(c)
        secret = (out / "run.secret").read_text().strip()  # there while the run lasts
        assert len(secret) == 64
        # while the ranks run: the secret is in nobody's argv
        deadline = time.monotonic() + 60
        while not processes_of_run(run_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_of_run(run_id), "the command never started"
        assert not any(secret.encode() in line for line in cmdlines())
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    assert secret not in c.output
    assert not (out / "run.secret").exists()
    verdict = next(line for line in c.lines if line.startswith("verdict:"))
    assert "rank 1 is the slow rank" in verdict and "data loading" in verdict, c.output
    assert f"torchlens report {out}" in c.output
    # one node: no command for other nodes; the ranks' profiled steps printed
    # torch's USDT lines, which are not passed on; no log line without step times
    assert "other nodes:" not in c.output and "TORCHLENS_COLLECTOR=" not in c.output
    assert "USDT:" not in c.output and "profiler_start" not in c.output, c.output
    assert "step ms:  |" not in c.output, c.output
    # the run folder: every step of both ranks; rank 1's data phase is the slow one
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["exit_code"] == 0
    assert manifest["dropped_messages"] == 0
    for r in (0, 1):
        steps = _steps(out, r)
        assert [s["step"] for s in steps] == list(range(30))
        assert [s.step for s in read_steps(str(out), r)] == list(range(30))
    data = [sorted(s["phases"]["data"] for s in _steps(out, r))[15] for r in (0, 1)]
    assert data[1] > 0.03 > data[0] * 10
    assert any(t.endswith(".pt.trace.json") for t in manifest["ranks"][1]["traces"])
    # and the report of the folder names rank 1
    assert "rank 1 is the slow rank" in report(out, tmp_path)[1]
    assert not processes_of_run(run_id)


def _two_nodes(tmp_path: Path, **extra: str) -> tuple[Collector, subprocess.Popen, str, Path]:
    out = tmp_path / "run"
    command = torchrun_args(2, 2, free_port())
    c = Collector(out, command, **extra)
    run_id = _run_id(c)
    line = c.wait_line("TORCHLENS_COLLECTOR=")
    extra_env, printed = other_node_env(line)
    assert printed == command and "TORCHLENS_RUN_SECRET" not in extra_env
    assert extra_env["TORCHLENS_RUN_SECRET_FILE"] == str(out / "run.secret")
    # every node's agent must build its rendezvous store the same way
    assert extra_env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    # its ranks attach at start too, from that node's own torchlens install
    from torchlens.frontends.ranks.autoattach import DIR
    assert extra_env["PYTHONPATH"].split(os.pathsep)[0] == DIR
    assert os.stat(out / "run.secret").st_mode & 0o777 == 0o600
    second = subprocess.Popen(printed, cwd=REPO, env=env(**extra_env, **extra),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    return c, second, run_id, out


@pytest.mark.parametrize("user_value, seen", [(None, "1"), ("0", "0")])
def test_restarts_get_a_fresh_rendezvous_store_unless_the_user_said_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_value: str | None,
        seen: str) -> None:
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    extra = {} if user_value is None else {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": user_value}
    show = "import os; print('store:', os.environ['TORCH_DISABLE_SHARE_RDZV_TCP_STORE'])"
    # "--nnodes 2": the other nodes' command is printed for a job of several nodes
    c = Collector(tmp_path / "run", [sys.executable, "-c", show, "--nnodes", "2"], **extra)
    try:
        assert c.wait(timeout=120) == 0, c.output
    finally:
        c.kill()
    assert f"store: {seen}" in c.lines, c.output
    printed = c.wait_line("TORCHLENS_COLLECTOR=")
    # the other nodes are told the value in effect here: every agent must agree
    assert f"TORCH_DISABLE_SHARE_RDZV_TCP_STORE={seen} " in printed


def test_two_nodes_on_localhost(tmp_path: Path) -> None:
    c, second, run_id, out = _two_nodes(tmp_path, TL_STEPS="20", TL_SLOW_S="0.01")
    try:
        assert c.wait() == 0, c.output
        assert second.wait(timeout=60) == 0
    finally:
        c.kill()
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == 4
    ranks = {r["rank"]: r for r in manifest["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3]
    # torchrun gives each node's ranks consecutive numbers: GROUP_RANK 0 has 0, 1
    assert {r: ranks[r]["node"] for r in ranks} == {0: 0, 1: 0, 2: 1, 3: 1}
    assert all(ranks[r]["state"] == "finished" for r in ranks)
    for r in range(4):
        assert len(_steps(out, r)) == 20
    rows = [line for line in c.lines if re.match(r"\s+\d+\s+\d+\s", line)]
    assert [int(line.split()[1]) for line in rows] == [0, 0, 1, 1], c.output
    assert not processes_of_run(run_id)


def test_lost_node(tmp_path: Path) -> None:
    c, second, run_id, out = _two_nodes(tmp_path, TL_STEPS="400", TL_SLOW_S="0.0",
                                        TL_STEP_SLEEP="0.05")
    try:
        deadline = time.monotonic() + 180
        victims: list[int] = []
        while time.monotonic() < deadline:  # the second agent's workers are stepping
            victims = [p.pid for p in psutil.Process(second.pid).children()]
            if len(victims) == 2 and all(
                    any((out / f"rank{r}").glob("step*.pt.trace.json")) for r in range(4)):
                break
            time.sleep(0.5)
        assert len(victims) == 2, c.output
        os.killpg(second.pid, signal.SIGKILL)  # the agent and its group; not its workers
        code = c.wait()
    finally:
        c.kill()
    assert code != 0
    manifest = json.loads((out / "manifest.json").read_text())
    lost = manifest["lost_nodes"]
    by_pid = {r["pid"]: r for r in manifest["ranks"]}
    victim_ranks = sorted(by_pid[p]["rank"] for p in victims)
    states = [(r["rank"], r["state"], r.get("bye")) for r in manifest["ranks"]]
    assert len(lost) == 1 and lost[0]["ranks"] == victim_ranks, (states, c.output[-3000:])
    assert lost[0]["node"] == by_pid[victims[0]]["node"]
    assert f"node {lost[0]['node']}" in c.output and "lost" in c.output
    assert "stopped" in manifest["stopped"]
    # the other node's ranks: their steps are kept, and they are not called lost
    for r in manifest["ranks"]:
        steps = _steps(out, r["rank"])
        assert len(steps) >= 5
        assert (r["state"] == "lost") == (r["rank"] in victim_ranks)
    time.sleep(1.0)
    assert not processes_of_run(run_id), [p.cmdline() for p in processes_of_run(run_id)]


@pytest.mark.parametrize("sent, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_ends_the_job_and_writes_the_folder(tmp_path: Path, sent: int,
                                                              status: int) -> None:
    out = tmp_path / "run"
    c = Collector(out, torchrun_args(1, 2, free_port()), TL_STEPS="1000", TL_SLOW_S="0.0",
                  TL_STEP_SLEEP="0.05")
    try:
        run_id = _run_id(c)
        deadline = time.monotonic() + 120
        while not all(any((out / f"rank{r}").glob("step*.pt.trace.json")) for r in (0, 1)):
            assert time.monotonic() < deadline, c.output
            time.sleep(0.5)
        os.kill(c.proc.pid, sent)  # SIGINT: what Ctrl-C sends; SIGTERM: kill, a scheduler
        # the status a shell gives a process that signal ended
        assert c.wait(timeout=90) == status, c.output
        name = "SIGTERM" if sent == signal.SIGTERM else "Ctrl-C"
        assert f"stopped by {name}: exit code {status}" in c.output
    finally:
        c.kill()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["interrupted"] is True and manifest["exit_code"] == status  # the shell's
    assert manifest["stopped"].startswith("interrupted after")
    for r in (0, 1):
        assert len(_steps(out, r)) >= 5
    assert not processes_of_run(run_id), [p.cmdline() for p in processes_of_run(run_id)]
