"""torchlens run fails open: when its own collector fails (a full disk, too
many open files), the training job goes on to its end, its exit status is the
job's, and the run says what was lost."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO, env

pytestmark = [pytest.mark.timeout(180), pytest.mark.faults]

#: a job that works for a few seconds and leaves a file when it got to its end
JOB = """
import pathlib, sys, time
for i in range(30):
    print(f"tick {i}", flush=True)
    time.sleep(0.15)
pathlib.Path(sys.argv[1]).write_text("done")
"""

#: ``torchlens run`` whose live loop raises what a full disk raises, once the job runs
RUN = """
import errno, sys, time
from torchlens.frontends.ranks import command
real = command.watch
def failing(collector, summary, running, *args, **kwargs):
    t0 = time.monotonic()
    def still():
        if time.monotonic() - t0 > 1.0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return running()
    return real(collector, summary, still, *args, **kwargs)
command.watch = failing
sys.exit(command.run([sys.executable, "-c", {job!r}, {done!r}], out={out!r}))
"""


def test_a_collector_that_fails_leaves_the_job_running_to_its_end(tmp_path: Path) -> None:
    done = tmp_path / "done"
    script = RUN.format(job=JOB, done=str(done), out=str(tmp_path / "run"))
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=150)
    output = proc.stdout + proc.stderr
    assert done.read_text() == "done", output  # the job ran to its last line
    assert "tick 29" in output, output  # and its output was still passed on
    assert proc.returncode == 0, output  # the job's status, not torchlens' failure
    assert "the collector failed" in output and "No space left on device" in output, output
    assert "the job goes on, watched again" in output, output
    lost = [line for line in output.splitlines() if line.startswith("torchlens run: lost: ")]
    assert lost and "the collector failed" in lost[0], output


#: two gloo ranks that train and print every step for a few seconds, each
#: leaving a file when it got to its end
RANKS = """
import os, pathlib, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(60):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    print(f"rank {dist.get_rank()} step {step}", flush=True)
    time.sleep(0.1)
pathlib.Path(sys.argv[1], f"done{dist.get_rank()}").write_text("done")
dist.destroy_process_group()
"""


def test_a_killed_torchlens_run_leaves_the_job_training(tmp_path: Path) -> None:
    """SIGKILL (the OOM killer) on ``torchlens run``: the pipes its job prints into
    lose their reader; the ranks go on to their end all the same. The folder the
    command never wrote is rebuilt from its spool by the first ``torchlens
    analyze``, which says so, and the run's secret does not stay behind."""
    import os
    import signal
    import time

    import psutil

    from .helpers import Collector, free_port, torchrun_args

    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    port = free_port()
    c = Collector(tmp_path / "run", [*torchrun_args(1, 2, port, script), str(tmp_path)])
    try:
        c.wait_line("rank 1 step 25", timeout=120, anywhere=True)  # records spooled by then
        family = psutil.Process(c.proc.pid).children(recursive=True)
        os.kill(c.proc.pid, signal.SIGKILL)  # torchlens run only: its job is in a session of its own
        c.proc.wait(timeout=10)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all(
                (tmp_path / f"done{r}").exists() for r in (0, 1)):
            time.sleep(0.5)
        assert all((tmp_path / f"done{r}").exists() for r in (0, 1)), c.output
    finally:
        for p in family if "family" in locals() else []:
            try:
                p.wait(timeout=30)  # torchrun ends once its ranks have
            except psutil.TimeoutExpired:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        c.kill()
    run = tmp_path / "run"
    assert not (run / "manifest.json").exists() and (run / ".spool").is_dir()
    said = subprocess.run([sys.executable, "-m", "torchlens", "analyze", str(run)], cwd=REPO,
                          env=env(), capture_output=True, text=True, timeout=120)
    out = said.stdout + said.stderr
    assert said.returncode == 0, out
    assert "rebuilt from torchlens run's spool" in out, out
    assert "ranks: 2 of 2 analysed" in out, out
    steps = [len((run / f"rank{r}" / "steps.jsonl").read_text().splitlines()) for r in (0, 1)]
    assert all(n >= 10 for n in steps), (steps, out)  # what was received before the kill
    assert not (run / ".spool").exists() and not (run / "run.secret").exists()
    again = subprocess.run([sys.executable, "-m", "torchlens", "analyze", str(run)], cwd=REPO,
                           env=env(), capture_output=True, text=True, timeout=120)
    assert again.stdout == said.stdout  # read as written, not rebuilt twice


def test_a_guarded_stream_drops_output_once_its_reader_left() -> None:
    import os

    from torchlens.capture.ranks.output_guard import PipeGuard

    read, write = os.pipe()
    os.close(read)  # the reader left
    raw = os.fdopen(write, "w")
    out = PipeGuard(raw)
    print("nobody reads this", file=out, flush=True)  # no BrokenPipeError
    assert out.gone
    print("nor this", file=out, flush=True)
    os.write(write, b"C-level writes go to /dev/null too\n")  # no EPIPE any more
    assert out.fileno() == write and not out.isatty()  # the stream's own attributes
    raw.close()


def test_a_closed_terminal_leaves_the_run_to_finish_and_write_its_folder(tmp_path: Path) -> None:
    """SIGHUP (the terminal closed, an ssh session dropped): nobody reads the
    summary any more, but the job runs to its end and the run folder is whole."""
    import json
    import signal

    from .helpers import Collector

    done = tmp_path / "done"
    c = Collector(tmp_path / "run", [sys.executable, "-c", JOB, str(done)])
    try:
        c.wait_line("tick 3", timeout=60)
        c.proc.send_signal(signal.SIGHUP)
        code = c.wait(timeout=120)
    finally:
        c.kill()
    assert code == 0, c.output  # the job's own status
    assert done.read_text() == "done"
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["exit_code"] == 0 and not manifest["interrupted"], manifest
    assert not (tmp_path / "run" / "run.secret").exists()  # no secret left behind
