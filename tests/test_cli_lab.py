"""``scripts/lab`` opens the tutorials, or the notebook folder you name.

It used to pass ``--notebook-dir=notebooks`` always, so naming another folder
made Jupyter refuse to start ("root_dir only accepts one value"). Here the
script runs against a stand-in ``jupyter`` that records what it was given.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECORDER = """#!/usr/bin/env python3
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd()}))
"""


@pytest.fixture
def lab(tmp_path: Path):
    """A copy of the repository's scripts/lab with a recording jupyter; returns a
    function that runs it from a folder of the user's with arguments."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "notebooks").mkdir()
    shutil.copy(REPO / "scripts" / "lab", repo / "scripts" / "lab")
    jupyter = repo / ".venv" / "bin" / "jupyter"
    jupyter.parent.mkdir(parents=True)
    jupyter.write_text(RECORDER)
    jupyter.chmod(0o755)
    user = tmp_path / "home"
    (user / "work").mkdir(parents=True)

    def run(*args: str) -> tuple[list[str], str]:
        done = subprocess.run([str(repo / "scripts" / "lab"), *args], cwd=user,
                              capture_output=True, text=True, timeout=30,
                              env={**os.environ})
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        argv = [a for a in seen["argv"] if a != "--allow-root"]
        return argv, seen["cwd"]

    run.repo = repo  # type: ignore[attr-defined]
    run.user = user  # type: ignore[attr-defined]
    return run


def _folders(argv: list[str]) -> list[str]:
    """Every way a notebook folder is named (Jupyter accepts exactly one): the
    flag (with its value when that is the next word), or a folder alone."""
    named, words = [], iter(argv[1:])
    for a in words:
        if a in ("--notebook-dir", "--ServerApp.root_dir"):
            named.append(f"{a} {next(words)}")
        elif a.startswith(("--notebook-dir=", "--ServerApp.root_dir=")) or (
                not a.startswith("-") and Path(a).is_dir()):
            named.append(a)
    return named


def test_without_a_folder_it_opens_the_tutorials(lab) -> None:
    argv, _ = lab("--port", "8899", "--no-browser")
    assert argv[0] == "lab"
    assert _folders(argv) == [f"--notebook-dir={lab.repo / 'notebooks'}"]
    assert argv[-3:] == ["--port", "8899", "--no-browser"]


@pytest.mark.parametrize("how", ["--notebook-dir={}", "--ServerApp.root_dir={}",
                                 "--notebook-dir {}", "{}"])
def test_a_folder_the_user_names_is_the_only_one(lab, how: str) -> None:
    words = how.format(lab.user / "work").split()
    argv, _ = lab(*words)
    assert _folders(argv) == [" ".join(words)]
    assert not any(str(lab.repo / "notebooks") in a for a in argv), argv


def test_a_relative_folder_is_from_where_the_user_runs_it(lab) -> None:
    argv, cwd = lab("work")
    assert argv == ["lab", "work"]
    assert Path(cwd) == lab.user  # Jupyter resolves "work" here, not in the repository
