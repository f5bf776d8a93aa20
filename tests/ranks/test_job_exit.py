"""A job that fails before any step is not a healthy run (``torchlens run``).

A mistyped script path: torchrun's workers exit with code 2 before the script
runs. The summary must lead with the failure (torchrun's exit code, the ranks'
exit codes, the job's own last lines), the command must exit with the job's
code, and the ranks, which ran no step, must show none.
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
    # rank, node, host, state, steps: no rank is "finished", none ran a step (its step
    # time is missing: model.units.MISSING, as the sidebar writes it)
    rows = [m.groups() for line in c.lines
            if (m := re.match(r"^ +([01]) +0 +\S+ +(.+?) +(\d+) +n/a ", line))]
    assert len(rows) == 2 and all(state in ("exit code 2", "killed by signal 15 (SIGTERM)")
                                  and steps == "0"
                                  for _, state, steps in rows), c.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["exit_code"] == 1
    assert "the job failed" in manifest["verdict"]
    assert [r["steps"] for r in manifest["ranks"]] == [0, 0]
    assert manifest["stopped"].startswith("ended with exit code 1"), manifest["stopped"]
