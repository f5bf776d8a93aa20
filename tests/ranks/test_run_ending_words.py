"""What ``torchlens run`` says and returns when its reader goes away, when it
is stopped by Ctrl-C, and which rank's error its last line leads with.

The command here is a small Python script, not torchrun: what is tested is
``torchlens run``'s own handling of its output, signals and last words.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchlens.analysis.ranks.verdict import RankRow
from torchlens.frontends.ranks.command import _Output, _tail, _where_stopped

from .helpers import REPO, env

pytestmark = pytest.mark.timeout(120)

#: a job that prints to stdout as it goes and says, in a file, that it ran to its end
JOB = """
import sys, time
for i in range(int(sys.argv[2])):
    print("step", i, flush=True)
    time.sleep(0.1)
open(sys.argv[1], "w").write("done")
"""


def _torchlens_run(out: Path, command: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torchlens", "run", "--out", str(out), "--",
                             *command], cwd=REPO, env=env(), start_new_session=True, **kwargs)


@pytest.mark.faults
def test_a_closed_stdout_does_not_end_the_job(tmp_path: Path) -> None:
    """``torchlens run ... | head -1``: the job runs to its end (past the
    summary's second log line, 10 s in), the exit status and run folder are
    those of a run without the pipe."""
    done = tmp_path / "done"
    err = (tmp_path / "stderr").open("w")
    proc = _torchlens_run(tmp_path / "run", [sys.executable, "-c", JOB, str(done), "115"],
                          stdout=subprocess.PIPE, stderr=err)
    try:
        assert proc.stdout.readline()  # head -1
        proc.stdout.close()
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 0
    assert done.read_text() == "done"  # the job was not ended, nor broken by its own prints
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["exit_code"] == 0 and manifest["interrupted"] is False
    err.close()  # the verdict and the folder, where the user still reads
    said = (tmp_path / "stderr").read_text()
    assert "verdict: " in said and f"run folder {tmp_path / 'run'}" in said, said


@pytest.mark.faults
def test_output_goes_to_devnull_once_the_reader_closed_it(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)
    stream = os.fdopen(write, "w")
    out = _Output(stream)
    print("a line nobody reads", file=out, flush=True)  # no BrokenPipeError
    assert out.gone and not out.isatty()
    print("and another", file=out, flush=True)
    stream.write("what the rest of the program prints\n")
    stream.flush()  # the descriptor is /dev/null now: no error at exit either
    stream.close()


#: a job that, ended by SIGTERM, prints a traceback (as torchrun's SignalException does)
STUBBORN = """
import signal, sys, time
def stop(signum, frame):
    raise RuntimeError("SignalException: got signal 15")
signal.signal(signal.SIGTERM, stop)
print("started", flush=True)
time.sleep(60)
"""


def _ctrl_c(tmp_path: Path, job: str) -> tuple[int, str]:
    # tty=True: the command's output goes to command.log, as on a terminal
    script = ("import sys\nfrom torchlens.frontends.ranks.command import run\n"
              f"sys.exit(run({[sys.executable, '-c', job]!r}, out={str(tmp_path / 'run')!r}, "
              "tty=True))")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log = tmp_path / "run" / "command.log"
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, output


def test_ctrl_c_says_the_exit_status_the_shell_gets_and_no_log_tail(tmp_path: Path) -> None:
    code, output = _ctrl_c(tmp_path, STUBBORN)
    assert code == 130
    # on a terminal a sentence wraps on words, its lines after the first indented
    output = output.replace("\n  ", " ")
    last = [line for line in output.splitlines() if "exit code" in line]
    # a plain python job: no rank attached, and the last line says so
    assert last and last[-1].startswith("torchlens run: interrupted before any step: no rank "
                                        "attached, no step recorded; stopped by Ctrl-C: "
                                        "exit code 130"), output
    assert "exit code 1 " not in output and "exit code 143" not in output, output
    # the log's end is the job's reaction to being stopped: not shown
    assert "the last lines of" not in output and "SignalException" not in output, output


def test_an_empty_log_gets_no_heading(tmp_path: Path) -> None:
    log = tmp_path / "command.log"
    log.write_text("")
    assert _tail(str(log)) == ""
    log.write_text("boom\n")
    assert _tail(str(log)).splitlines() == [f"the last lines of {log}:", "boom"]


GLOO = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
        "Connection closed by peer [127.0.0.1]:7348. This is typically caused by a remote "
        "worker crashing. Check the logs of the remote worker before reporting an error.")


@pytest.mark.parametrize("raised", [None, {0: 10.0, 1: 11.0}])
def test_the_failing_rank_leads_the_last_line_not_the_peer_it_took_down(raised) -> None:
    """Rank 1 raised; rank 0 then failed as its connection to rank 1 closed.
    The peer's error leads neither by rank number nor by an earlier clock."""
    view = SimpleNamespace(lost=[], restarts=[], ranks=[
        RankRow(rank=0, state="failed", error=GLOO, steps=15),
        RankRow(rank=1, state="failed", error="RuntimeError: rank 1 boom at step 15",
                steps=15)])
    words = (_where_stopped(view, False, 1, raised) if raised is not None
             else _where_stopped(view, False, 1))
    assert words.startswith("ended with exit code 1: rank 1 failed (RuntimeError: rank 1 boom "
                            "at step 15); rank 0 stopped when rank 1 went away (gloo: "
                          "connection closed by peer)"), words


def test_a_rank_that_ended_by_itself_leads_the_one_its_agent_then_ended() -> None:
    """A mistyped script: rank 1 exits with code 2, torchrun's agent then ends
    rank 0 with SIGTERM. Rank 1 leads the last line whatever the rank order."""
    view = SimpleNamespace(lost=[], restarts=[], ranks=[
        RankRow(rank=0, state="killed by signal 15 (SIGTERM)", steps=0),
        RankRow(rank=1, state="exit code 2", steps=0)])
    words = _where_stopped(view, False, 1)
    assert words.startswith("ended with exit code 1: rank 1 exit code 2; rank 0 killed"), words
