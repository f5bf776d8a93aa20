"""``torchlens run -- torchrun ... train.py`` on a script that never imports
torchlens: the ranks attach when they start
(``frontends/ranks/autoattach/sitecustomize.py``) and their steps are found
from the optimizer (``capture.ranks.autostep``). Real torchrun, CPU, gloo;
expected figures read from the run folder's own files with json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ranks.helpers import REPO, TORCHRUN, Collector, env, free_port, report
from torchlens.frontends.ranks.autoattach import DIR as AUTOATTACH

pytestmark = pytest.mark.timeout(300)
SCRIPT = Path(__file__).with_name("no_import_train.py")
ITERATIONS = 12


def _torchrun(port: int) -> list[str]:
    return [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job{port}", str(SCRIPT)]


def _run(tmp_path: Path, **extra: str) -> tuple[Collector, Path]:
    out = tmp_path / "run"
    c = Collector(out, _torchrun(free_port()), TL_STEPS=str(ITERATIONS), **extra)
    try:
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    return c, out


def _steps(run_dir: Path, rank: int) -> list[dict]:
    with open(run_dir / f"rank{rank}" / "steps.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _set_up_windows_then(steps: list[dict]) -> None:
    """Steps 0..ITERATIONS-1, one per optimizer.step(). On a loaded machine the
    set-up before the first step can outlast the first fixed window (10 s):
    such window records come first, marked ``window``, and steps count from 0
    after them (``Stepper._windows_were_set_up``)."""
    windows = [s for s in steps if s.get("window")]
    assert steps[:len(windows)] == windows, steps
    assert [s["step"] for s in steps[len(windows):]] == list(range(ITERATIONS)), steps


def test_a_script_without_torchlens_gets_steps_the_slow_rank_and_the_report(
        tmp_path: Path) -> None:
    c, out = _run(tmp_path)
    assert "not attached" not in c.output and "not reporting" not in c.output, c.output
    verdict = next(line for line in c.lines if line.startswith("verdict:"))
    assert "rank 1 is the slow rank" in verdict and "data loading" in verdict, c.output
    # the view says how the steps were found
    assert "note: steps: optimizer.step() of Adam" in c.output, c.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["exit_code"] == 0 and manifest["world_size"] == 2
    assert "steps: optimizer.step() of Adam" in manifest["notes"]
    for r in (0, 1):  # one step per iteration: each optimizer.step() ended one
        steps = _steps(out, r)
        _set_up_windows_then(steps)
    _, text = report(out, tmp_path)
    assert "rank 1 is the slow rank" in text and "optimizer.step() of Adam" in text


def test_a_script_that_also_calls_torchlens_step_is_not_counted_twice(tmp_path: Path) -> None:
    c, out = _run(tmp_path, TL_ALSO_STEP="1")
    assert "note: steps: torchlens.step()" in c.output, c.output
    for r in (0, 1):
        _set_up_windows_then(_steps(out, r))


def _python(code: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env(**extra))


def test_the_hook_never_breaks_the_job_and_runs_the_sitecustomize_it_hides(
        tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    path = os.pathsep.join([AUTOATTACH, str(mine), str(REPO)])
    code = "import os; print('job ran', os.environ.get('USER_SITE_RAN'))"
    # a rank with a collector address it cannot read: one line, and the job runs
    done = _python(code, tmp_path, PYTHONPATH=path, TORCHLENS_COLLECTOR="nowhere",
                   RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    assert done.returncode == 0 and "job ran 1" in done.stdout, done.stderr
    said = [line for line in done.stderr.splitlines() if "torchlens" in line]
    assert len(said) == 1 and "expected HOST:PORT" in said[0], done.stderr
    # not a rank (torchrun's agent, a plain python): nothing is attached, nothing said
    done = _python(code, tmp_path, PYTHONPATH=path, TORCHLENS_COLLECTOR="nowhere")
    assert done.returncode == 0 and "job ran 1" in done.stdout and not done.stderr
