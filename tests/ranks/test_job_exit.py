"""A job that fails before any step is not a healthy run (``torchlens run``).

A mistyped script path: torchrun's workers exit with code 2 before the script
runs. The summary must lead with the failure (torchrun's exit code, the ranks'
exit codes, the job's own last lines), the command must exit with the job's
code, and no rank may be shown as having run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .helpers import TORCHRUN, Collector, free_port

pytestmark = pytest.mark.timeout(300)


def test_mistyped_script_path_is_a_failed_job(tmp_path: Path) -> None:
    out = tmp_path / "run"
    port = free_port()
    command = [TORCHRUN, "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job{port}",
               str(tmp_path / "ddp_plian.py")]
    c = Collector(out, command)
    try:
        code = c.wait(timeout=200)
    finally:
        c.kill()
    assert code == 1, c.output  # torchrun's own exit code, passed on
    verdict = next(line for line in c.lines if line.startswith("verdict:"))
    assert "the job failed" in verdict and "exit code 1" in verdict, c.output
    # torchrun's report: each rank's exit code (a rank the agent ended first: signal 15)
    assert re.search(r"exit code 1; ranks? [0-9, -]+ exited with code 2", verdict), c.output
    assert "can't open file" in verdict and "ddp_plian.py" in verdict, c.output
    assert "no slow rank" not in c.output, c.output
    # a worker whose script is missing does not attach (its interpreter fails at
    # once, as under bare torchrun, instead of importing torch first): no rank
    # row claims it ran, and the verdict above names each one's exit code
    assert "ranks: 0 of ? attached" in c.output, c.output
    assert not [line for line in c.lines if re.match(r"^ +[01] +0 +\S+ +finished", line)]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["exit_code"] == 1
    assert "the job failed" in manifest["verdict"] and "exited with code 2" in manifest["verdict"]
    assert all(r["steps"] == 0 for r in manifest["ranks"])
    assert manifest["stopped"].startswith("ended with exit code 1"), manifest["stopped"]
