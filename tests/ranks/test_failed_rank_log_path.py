"""A rank that raises under ``torchlens run``: the verdict's advice says where
its traceback is. On a terminal the command's output goes to the run folder's
``command.log``: the advice names that file by its path, on the terminal and in
the run folder's verdict. Real torchrun, CPU, gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchlens.analysis.ranks.job_exit import output_where
from torchlens.frontends.cli.main import main
from torchlens.model.findings import FAILED, FAILED_RANK, Figure, Finding

from .helpers import REPO, env, free_port, torchrun_args

pytestmark = pytest.mark.timeout(300)


def test_a_failed_ranks_advice_names_the_command_log_by_its_path(tmp_path: Path,
                                                                 capsys) -> None:
    out = tmp_path / "run"
    command = torchrun_args(1, 2, free_port())
    # tty=True: the command's output goes to command.log, as on a terminal
    code = ("import sys\nfrom torchlens.frontends.ranks.command import run\n"
            f"sys.exit(run({command!r}, out={str(out)!r}, tty=True))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=240, env=env(TL_FAIL_ONCE_AT="12", TL_STEPS="16"))
    assert done.returncode != 0, done.stdout + done.stderr
    log = out / "command.log"
    assert "[rank1]:" in log.read_text()  # the traceback the advice points to is there
    said = f"look at rank 1's traceback: its [rank1]: lines in {log}"
    # the terminal wraps the verdict at its width: read it as one line of words
    words = " ".join(done.stdout.split())
    assert said in words, done.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["verdict_code"] == FAILED_RANK and said in manifest["verdict"]
    # the folder read again (analyze, report) says it too; so does a folder
    # whose saved advice gave no path (written by an earlier torchlens)
    text = (out / "manifest.json").read_text()
    (out / "manifest.json").write_text(text.replace(
        f"lines in {log}", "lines in the command's output (command.log in the run folder "
        "when it ran on a terminal)"))
    assert said not in (out / "manifest.json").read_text()
    assert main(["analyze", str(out)]) == 0
    assert said in capsys.readouterr().out


def _failed(advice: str) -> Finding:
    return Finding(FAILED, "rank 2 failed: RuntimeError: boom", (Figure("rank", 2),),
                   advice=advice, code=FAILED_RANK)


def test_without_a_log_the_advice_points_to_the_output_above() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class View:
        verdict: Finding

    generic = ("look at rank 2's traceback: its [rank2]: lines in the command's output "
               "(command.log in the run folder when it ran on a terminal)")
    view = output_where(View(_failed(generic)), None)
    assert view.verdict.advice == ("look at rank 2's traceback: its [rank2]: lines in the "
                                   "command's output above")
    # another failed-rank advice (its peer went away) is left as it is
    other = View(_failed("look at the other ranks' logs for the one that ended first"))
    assert output_where(other, "/x/command.log") is other
