"""Interrupting a running %ddp_check in a real kernel leaves no process behind."""

from __future__ import annotations

import os
import time

import psutil
import pytest
from jupyter_client import KernelManager

from .conftest import group_alive

SETUP = """
%load_ext torchlens
def sleepy(rank, world_size):
    import time
    import torch
    import torch.distributed as dist
    dist.all_reduce(torch.ones(2))
    time.sleep(300)
"""


def _workers(kernel_pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(kernel_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in kids if "torchlens.capture.ddp.worker" in " ".join(p.cmdline())]


def _board(pid: int) -> str:
    """The --strict shared-memory file a worker has mapped, or ''."""
    try:
        maps = psutil.Process(pid).memory_maps()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""
    return next((m.path for m in maps if m.path.endswith(".board")), "")


def _reply(kc, msg_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg
    raise TimeoutError("no execute_reply")


@pytest.mark.slow
def test_sigint_to_kernel_stops_every_worker(tmp_path):
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    pids: list[int] = []
    try:
        kc.wait_for_ready(timeout=120)
        assert _reply(kc, kc.execute(SETUP), 120)["content"]["status"] == "ok"
        kernel_pid = km.provisioner.process.pid
        msg_id = kc.execute("%ddp_check sleepy --world-size 2 --timeout 200 --no-live --strict")
        deadline = time.monotonic() + 120
        while len(_workers(kernel_pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [p.pid for p in _workers(kernel_pid)]
        assert len(pids) == 2, "workers did not start"
        boards = [""]
        while not all(boards) and time.monotonic() < deadline:  # both ranks in the step
            time.sleep(0.2)
            boards = [_board(pid) for pid in pids]
        assert all(boards) and len(set(boards)) == 1, f"no shared --strict board: {boards}"
        time.sleep(1)
        km.interrupt_kernel()  # SIGINT, as the notebook's stop button sends
        reply = _reply(kc, msg_id, 60)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        for pid in pids:
            assert not group_alive(pid), f"worker group {pid} survived the interrupt"
        assert _workers(kernel_pid) == []
        board = boards[0]
        assert not os.path.exists(board), f"--strict board {board} survived the interrupt"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        for pid in pids:
            try:
                os.killpg(pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
