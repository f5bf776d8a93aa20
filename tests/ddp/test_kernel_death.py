"""A notebook kernel that dies during ``%ddp_check --profile``: the saved
notebook still says where the run's folder is, that folder keeps the steps the
ranks made, its report says the run was cut off, and no rank is left running."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from jupyter_client import KernelManager

from torchlens.frontends.cli.main import main

from .conftest import group_alive

SETUP = """
%load_ext torchlens
def train(rank, world_size):
    import time
    import torch
    import torchlens
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(100000):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
        torchlens.step()
        time.sleep(0.01)
"""


def _outputs(kc, until: float) -> list[dict]:
    """The display messages of the cell so far (what a saved notebook keeps)."""
    out = []
    while time.monotonic() < until:
        try:
            msg = kc.get_iopub_msg(timeout=0.2)
        except Exception:  # noqa: BLE001 - queue.Empty: nothing more yet
            continue
        if msg["msg_type"] in ("display_data", "update_display_data"):
            out.append(msg["content"]["data"])
    return out


def _steps(run_dir: str, rank: int) -> int:
    path = os.path.join(run_dir, f"rank{rank}", "steps.jsonl")
    if not os.path.isfile(path):
        return 0
    with open(path, "rb") as fh:
        return sum(1 for _ in fh)


@pytest.mark.slow
def test_a_dead_kernel_leaves_its_folder_named_and_readable(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    workers: list[psutil.Process] = []
    try:
        kc.wait_for_ready(timeout=120)
        kc.execute(SETUP)
        kc.execute(f"%ddp_check train --world-size 2 --profile --run-dir {run_dir} "
                   "--timeout 300")
        kernel = psutil.Process(km.provisioner.process.pid)
        deadline = time.monotonic() + 150
        shown: list[dict] = []
        # until both ranks have step records in the folder, while they run
        while time.monotonic() < deadline and min(_steps(run_dir, 0), _steps(run_dir, 1)) < 50:
            shown += _outputs(kc, time.monotonic() + 1)
        assert min(_steps(run_dir, 0), _steps(run_dir, 1)) >= 50, "no steps in the folder"
        workers = kernel.children(recursive=True)
        assert len(workers) >= 2
        os.kill(kernel.pid, signal.SIGKILL)
    finally:
        kc.stop_channels()
    html = " ".join(str(d.get("text/html", "")) for d in shown)
    assert f"run folder <code>{run_dir}</code>" in html
    assert f"torchlens report {run_dir}" in html
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(group_alive(p.pid) for p in workers):
        time.sleep(0.5)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers), \
        "a rank outlived its kernel"
    assert not os.path.exists(os.path.join(run_dir, "manifest.json"))
    capsys.readouterr()
    assert main(["analyze", run_dir]) == 0
    out = capsys.readouterr().out
    assert "run: 2 ranks of 2 analysed" in out
    assert "manifest.json is missing: the run was cut off" in out
    assert "every step over time and the slow rank come from the ranks' steps.jsonl" in out
