"""What ``torchlens run`` prints for a one-node job.

- no "other nodes: ... run: ..." line: there is no second node to start;
- written to a file (not a terminal), no ``step ms:  |`` line with no value;
- torch's ``USDT: ... profiler_start/stop`` lines from the ranks do not pass
  through (the rule that hides them in a notebook), the command's own do.

The command here is a real process that runs torch's profiler, as a rank's
profiled step does; it never attaches, as a job before its first step.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from torchlens.frontends.ranks.command import run

#: a "rank": the profiler's start and stop (torch prints its USDT lines), then
#: a line of its own on each stream
CHILD = r"""
import sys, time
import torch
from torch.profiler import profile
for _ in range(2):
    with profile():
        torch.ones(8).sum()
print("rank says hello on stdout", flush=True)
print("rank says hello on stderr", file=sys.stderr, flush=True)
time.sleep(0.6)  # a few polls of the collector: the log line is drawn
"""


@pytest.fixture(autouse=True)
def _torch_log_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")  # run() sets it: restored after


def test_a_one_node_job_logged_to_a_file(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    said = io.StringIO()
    assert run([sys.executable, "-c", CHILD], out=str(tmp_path / "run"), stream=said,
               tty=False) == 0
    text = said.getvalue()
    assert "other nodes:" not in text and "TORCHLENS_COLLECTOR=" not in text, text
    assert "torchlens run: run " in text and "torchlens report" in text
    logged = [line for line in text.splitlines() if "| step ms:" in line]
    assert logged, text  # the log line was drawn at least once
    assert all("step ms:  |" not in line for line in logged), logged
    assert "step ms: none yet, no rank attached |" in logged[0]
    out, err = capfd.readouterr()
    assert "rank says hello on stdout" in out
    assert "rank says hello on stderr" in err
    assert "USDT:" not in err and "profiler_start" not in err, err


def test_the_command_log_on_a_terminal_keeps_the_output_without_torchs_lines(
        tmp_path: Path) -> None:
    said = io.StringIO()
    assert run([sys.executable, "-c", CHILD], out=str(tmp_path / "run"), stream=said,
               tty=True) == 0
    log = (tmp_path / "run" / "command.log").read_text()
    assert "rank says hello on stdout" in log and "rank says hello on stderr" in log
    assert "USDT:" not in log and "profiler_st" not in log, log


@pytest.mark.parametrize("command, count", [
    (["torchrun", "--nproc-per-node", "2", "train.py"], 1),
    (["torchrun", "--nnodes", "1", "train.py", "--nnodes", "4"], 1),
    (["torchrun", "--nnodes", "2", "train.py"], 2),
    (["torchrun", "--nnodes=1:4", "train.py"], 4),
    (["python", "-m", "torch.distributed.run", "--nnodes=3", "train.py"], 3),
    (["python", "train.py"], 1),
])
def test_the_node_count_is_read_from_torchruns_arguments(command: list[str],
                                                         count: int) -> None:
    from torchlens.frontends.ranks.command import nodes

    assert nodes(command) == count


def test_two_nodes_get_the_other_nodes_command(tmp_path: Path) -> None:
    said = io.StringIO()
    # not torchrun, but the words it would take: the printed line is what is tested
    assert run([sys.executable, "-c", "pass", "--nnodes", "2"], out=str(tmp_path / "run"),
               stream=said, tty=False) == 0
    text = said.getvalue()
    assert "other nodes: the collector listens on loopback only" in text
    assert "TORCHLENS_COLLECTOR=" in text
