"""Without ../shared/testdata (a plain clone), the tests that read it are skipped
with a reason that says where it comes from; with CI set they fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    run_env = {k: v for k, v in os.environ.items() if k != "CI"}
    run_env.update(TORCHLENS_TESTDATA=str(tmp_path / "no-such-folder"), PYTHONPATH=str(REPO), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/runs/test_clock.py"], cwd=REPO, env=run_env,
                          capture_output=True, text=True, timeout=300)


def test_missing_shared_data_skips_with_the_reason(tmp_path: Path) -> None:
    done = _pytest(tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "skipped" in done.stdout and "failed" not in done.stdout
    assert "needs the shared test data" in done.stdout and "CI clones" in done.stdout


def test_missing_shared_data_fails_under_ci(tmp_path: Path) -> None:
    done = _pytest(tmp_path, CI="true")
    assert done.returncode == 1 and "shared test data missing" in done.stdout
