"""Real faults under ``torchlens run`` (not simulated): a two-rank gloo job goes
on to its end, exits 0, and the run says what torchlens lost and why, when the
collector runs out of file descriptors and when the run folder's disk fills."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .helpers import REPO, Collector, env, free_port, torchrun_args
from .test_fail_open import RANKS

pytestmark = [pytest.mark.timeout(240), pytest.mark.faults]

#: the collector's descriptor limit, and how many idle connections the flood holds
LIMIT = 1024
FLOOD = 1100


class LimitedCollector(Collector):
    """``torchlens run`` started as by a shell whose ``ulimit -n`` is ``LIMIT``
    (soft and hard: it cannot raise it), in its own session."""

    def __init__(self, out: Path, command: list[str]) -> None:
        def limited() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchlens", "run", "--out", str(out), "--", *command],
            cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, preexec_fn=limited)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()


def _flood(port: int, held: list[socket.socket], stop: threading.Event) -> None:
    """``FLOOD`` idle connections to the collector's port, held until ``stop``."""
    for _ in range(FLOOD):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        held.append(s)
    stop.wait()
    for s in held:
        s.close()


def _lost(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("torchlens run: lost: ")]


def test_a_collector_out_of_descriptors_leaves_the_job_training(tmp_path: Path) -> None:
    """1,100 idle connections to the collector under ``ulimit -n 1024``: the store
    takes a descriptor for each until none is left. The job still starts (the
    flood may come first), trains to its end with exit 0, and the run names
    the limit, the sockets and what was lost."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FLOOD + 200  # this process holds the flood's side of every connection
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"the flood needs {want} descriptors in the test; its hard limit is {hard}")
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    c = LimitedCollector(tmp_path / "run", [*torchrun_args(1, 2, free_port(), script),
                                            str(tmp_path)])
    held: list[socket.socket] = []
    stop = threading.Event()
    try:
        first = c.wait_line("torchlens run: run ", timeout=60)
        port = int(re.search(r"collector 127\.0\.0\.1:(\d+)", first).group(1))
        flood = threading.Thread(target=_flood, args=(port, held, stop), daemon=True)
        flood.start()
        code = c.wait(timeout=200)
    finally:
        stop.set()
        c.kill()
        if soft != resource.RLIM_INFINITY and soft < want:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    out = c.output
    assert len(held) > LIMIT - 100, (len(held), out)  # the flood did fill the table
    assert all((tmp_path / f"done{r}").exists() for r in (0, 1)), out  # trained to its end
    assert "rank 0 step 59" in out and "rank 1 step 59" in out, out
    assert code == 0, out  # the job's own status
    lost = _lost(out)
    ran_out = [line for line in lost if "ran out of file descriptors" in line]
    assert ran_out and f"RLIMIT_NOFILE {LIMIT:,}" in ran_out[0], out
    assert "sockets: connections to its store port" in ran_out[0], out
    assert "ulimit -n" in ran_out[0], out  # and what to do about it


def _mount_tmpfs(where: Path, size: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("a small real filesystem needs a tmpfs mount: not root")
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not allowed here: {done.stderr.strip()}")


def test_a_full_disk_under_the_run_folder_leaves_the_job_training(tmp_path: Path) -> None:
    """``--out`` on a 4 MB tmpfs, filled once the ranks train: the collector's
    spool and the folder cannot be written, the job trains to its end with
    exit 0, and the run says the collector lost records to the full disk."""
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "4m")
    try:
        script = tmp_path / "ranks.py"
        script.write_text(RANKS)
        c = Collector(disk / "run", [*torchrun_args(1, 2, free_port(), script), str(tmp_path)])
        try:
            c.wait_line("rank 1 step 5", timeout=150, anywhere=True)
            with open(disk / "filler", "wb") as fh:
                with contextlib.suppress(OSError):
                    while True:
                        fh.write(b"\0" * (64 << 10))
                        fh.flush()
            assert os.statvfs(disk).f_bavail == 0  # full while the job still trains
            code = c.wait(timeout=150)
        finally:
            c.kill()
    finally:
        deadline = time.monotonic() + 30
        while subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                subprocess.run(["umount", "-l", str(disk)], capture_output=True)
                break
            time.sleep(0.5)
    out = c.output
    assert "rank 0 step 59" in out and "rank 1 step 59" in out, out  # trained on
    assert all((tmp_path / f"done{r}").exists() for r in (0, 1)), out
    assert code == 0, out
    lost = _lost(out)
    # how many of the records it read never reached the disk, and why
    unspooled = [line for line in lost if "could not be written to its spool" in line]
    assert unspooled and "No space left on device" in unspooled[0], out
    batches = int(re.search(r"lost: (\d+) step batches", unspooled[0]).group(1))
    assert batches > 0, out
    assert not any("the collector failed" in line for line in lost), out  # no pause


def test_a_full_descriptor_table_is_seen_and_the_reserve_opens_what_must_open() -> None:
    """In this process: with the table filled by sockets, an open fails, the
    watch records the limit and the sockets, and the reserve given back lets
    the open that must not fail (the command's start) succeed."""
    from torchlens.capture.ranks.descriptors import DescriptorWatch, Reserve, count_open

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    counted = count_open()
    if counted is None:
        pytest.skip("no /proc/self/fd here")
    low = counted[0] + 64
    held: list[socket.socket] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        reserve = Reserve(8)
        watch = DescriptorWatch(every_s=0)
        assert len(reserve.fds) == 8 and watch.limit == low
        with pytest.raises(OSError):
            while True:
                held.append(socket.socket())
        with pytest.raises(OSError):
            open(os.devnull)  # noqa: SIM115 - the table is full
        watch.check()
        assert watch.full is not None and watch.full.limit == low
        assert watch.full.peak == low and watch.full.sockets >= len(held) - 1
        reserve.release()
        with open(os.devnull) as fh:  # what the reserve is for
            assert fh.read() == ""
        watch.close()
    finally:
        for s in held:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
