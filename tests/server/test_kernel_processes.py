"""Which GPU processes are this server's kernels, or processes a kernel started (DDP ranks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from fake_nvml import FakeNvml, gpu
from sampler_doubles import StepHost

from torchlens.capture.monitor.gpu import NvmlSampler
from torchlens.frontends.monitor.sampler import Monitor
from torchlens.frontends.server.stream import kernel_of, psutil_parent, tag_kernels

# the child starts a grandchild in its own session, as %ddp_check starts its workers
SPAWN_GRANDCHILD = """
import subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                     start_new_session=True)
print(g.pid, flush=True)
try:
    time.sleep(60)
finally:
    g.kill()
"""


class FakeKernelManager:
    """Just what ``kernel_pids`` reads from jupyter_server's MultiKernelManager."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    def list_kernel_ids(self) -> list[str]:
        return list(self.pids)

    def get_kernel(self, kid: str) -> Any:
        return SimpleNamespace(provisioner=SimpleNamespace(pid=self.pids[kid]))


@pytest.fixture
def family() -> Iterator[tuple[int, int]]:
    """(child pid, grandchild pid in a new session) of this test process; killed after."""
    child = subprocess.Popen(
        [sys.executable, "-c", SPAWN_GRANDCHILD], stdout=subprocess.PIPE, text=True
    )
    grandchild = None
    try:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        yield child.pid, grandchild
    finally:
        child.kill()  # SIGKILL skips its ``finally``: kill the grandchild by pid too
        child.wait(timeout=10)
        child.stdout.close()
        if grandchild is not None:
            try:
                os.kill(grandchild, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_parent_walk_finds_real_children_across_sessions(
    family: tuple[int, int],
) -> None:
    child, grandchild = family
    assert os.getsid(grandchild) != os.getsid(0)  # not findable by session/group
    kernels = {os.getpid(): "k1"}
    assert kernel_of(os.getpid(), kernels) == ("k1", False)
    assert kernel_of(child, kernels) == ("k1", True)
    assert kernel_of(grandchild, kernels) == ("k1", True)
    assert kernel_of(grandchild, kernels, max_depth=1) is None  # bounded walk
    assert kernel_of(os.getppid(), kernels) is None  # our parent is not our child


def test_vanished_or_invisible_pid_is_not_ours() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert psutil_parent(dead.pid) is None
    assert kernel_of(dead.pid, {os.getpid(): "k1"}) is None


def test_tag_kernels_with_real_processes(family: tuple[int, int]) -> None:
    child, grandchild = family
    procs = [SimpleNamespace(pid=p, usedGpuMemory=1) for p in (grandchild, 1)]
    nvml = NvmlSampler(api=FakeNvml([gpu("GPU-a", compute=procs)]), environ={},
                        nested_pids=False)  # local pids, also when the tests run in a container
    mon = Monitor(StepHost(), nvml)
    sample = mon.sample_once()
    settings = {"kernel_manager": FakeKernelManager({"k1": os.getpid()})}
    tag_kernels([sample], settings)
    sample = msgspec.to_builtins(sample)  # as the page gets it
    got = {
        p["pid"]: (p["kernel"], p["kernel_child"])
        for p in sample["gpu"]["gpus"][0]["processes"]
    }
    assert got == {grandchild: ("k1", True), 1: (None, False)}


def test_tag_kernels_with_a_fake_process_table() -> None:
    # 100: kernel A; 120 -> 110 -> 100: a rank under a launcher; 200: kernel B;
    # 300: someone else's; 400: parent unknown (gone); 500 <-> 501: a broken table
    parents = {120: 110, 110: 100, 100: 50, 200: 50, 300: 1, 500: 501, 501: 500}
    on_gpu0 = [100, 120, 300, 400, 500]
    on_gpu1 = [120, 200]
    fake = FakeNvml(
        [
            gpu(
                "GPU-a",
                compute=[SimpleNamespace(pid=p, usedGpuMemory=1) for p in on_gpu0],
            ),
            gpu(
                "GPU-b",
                compute=[SimpleNamespace(pid=p, usedGpuMemory=1) for p in on_gpu1],
            ),
        ]
    )
    mon = Monitor(StepHost(), NvmlSampler(api=fake, environ={}, process_name=str,
                                                nested_pids=False))
    older, newest = mon.sample_once(), mon.sample_once()
    settings = {"kernel_manager": FakeKernelManager({"kA": 100, "kB": 200})}
    lookups: list[int] = []

    def parent_of(pid: int) -> int | None:
        lookups.append(pid)
        return parents.get(pid)

    tag_kernels([older, newest], settings, parent_of)
    older, newest = msgspec.to_builtins([older, newest])  # as the page gets them
    tags = [
        {p["pid"]: (p["kernel"], p["kernel_child"]) for p in g["processes"]}
        for g in newest["gpu"]["gpus"]
    ]
    assert tags[0] == {
        100: ("kA", False),
        120: ("kA", True),
        300: (None, False),
        400: (None, False),
        500: (None, False),
    }
    assert tags[1] == {120: ("kA", True), 200: ("kB", False)}
    assert len(lookups) == len(set(lookups))  # one lookup per pid per tagging
    assert "kernel" not in older["gpu"]["gpus"][0]["processes"][0]  # only the newest


def test_no_kernels_means_no_parent_lookups() -> None:
    fake = FakeNvml([gpu("GPU-a")])
    sample = Monitor(StepHost(), NvmlSampler(api=fake, environ={})).sample_once()
    tag_kernels([sample], {}, parent_of=lambda pid: pytest.fail("walked"))
    assert msgspec.to_builtins(sample)["gpu"]["gpus"][0]["processes"][0]["kernel"] is None


def test_host_pids_in_a_container_are_not_walked_and_the_sample_says_so() -> None:
    # NVML's pids are the host's here: kernel 100's own pid number must not be
    # matched (on the host it is some other process), and no parent is looked up
    fake = FakeNvml([gpu("GPU-a", compute=[SimpleNamespace(pid=100, usedGpuMemory=1)])])
    sampler = NvmlSampler(api=fake, environ={}, process_name=str, nested_pids=True)
    sample = Monitor(StepHost(), sampler).sample_once()
    settings = {"kernel_manager": FakeKernelManager({"kA": 100})}
    tag_kernels([sample], settings, parent_of=lambda pid: pytest.fail("walked"))
    sample = msgspec.to_builtins(sample)  # as the page gets it
    proc = sample["gpu"]["gpus"][0]["processes"][0]
    assert (proc["kernel"], proc["kernel_child"], proc["name"]) == (None, False, None)
    assert sample["gpu"]["pids"] == "host"
    assert "process ids are the host's" in sample["gpu"]["pids_note"]
    assert "names not shown" in sample["gpu"]["pids_note"]
