"""A run that ended with no step recorded says so once, and why, not "waiting".

``accelerate launch --cpu`` starts its processes without torchrun: none
attaches (docs/integrations/accelerate.md), and the run used to end with
``waiting for steps: 0 of ? ranks attached`` next to ``finished: every rank
said goodbye (0 steps...)``. A Ctrl-C before the first step left "waiting
for steps" as the verdict too. Real launchers, CPU, gloo.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from .helpers import BIN, TORCHRUN, Collector, free_port

pytestmark = pytest.mark.timeout(300)


def _verdict(c: Collector) -> str:
    return next(line for line in c.lines if line.startswith("verdict:"))


def _last_word(c: Collector) -> str:
    """The run's last status line (before the run-folder lines)."""
    return [line for line in c.lines if line.startswith("torchlens run:")
            and "run folder" not in line][-1]


def test_accelerate_cpu_ends_with_no_rank_attached(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    script = tmp_path / "job.py"
    script.write_text("print('the job ran')\n")
    out = tmp_path / "run"
    c = Collector(out, [str(BIN / "accelerate"), "launch", "--cpu", "--num_processes", "2",
                        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend",
                        "no", str(script)], HF_HOME=str(tmp_path / "hf"))
    try:
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    verdict = _verdict(c)
    assert "waiting" not in verdict, c.output
    assert "no step recorded: no rank attached" in verdict, c.output
    assert "accelerate launch --cpu" in verdict and "torchrun" in verdict, c.output
    last = _last_word(c)
    assert "no rank attached" in last and "said goodbye" not in last, c.output
    assert "said goodbye" not in c.output, c.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert "no rank attached" in manifest["verdict"] and "no rank attached" in manifest["stopped"]


def test_ctrl_c_before_the_first_step_is_no_waiting_verdict(tmp_path: Path) -> None:
    script = tmp_path / "slow_setup.py"
    script.write_text("import time\nprint('set-up', flush=True)\ntime.sleep(120)\n")
    port = free_port()
    out = tmp_path / "run"
    c = Collector(out, [TORCHRUN, "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job{port}",
                        str(script)])
    try:
        c.wait_line("set-up", timeout=120)
        time.sleep(2)  # both ranks' hellos read
        os.kill(c.proc.pid, signal.SIGINT)
        assert c.wait(timeout=120) == 130, c.output
    finally:
        c.kill()
    verdict = _verdict(c)
    assert "waiting" not in verdict, c.output
    assert "no step recorded" in verdict and "2 of 2 ranks attached" in verdict, c.output
    assert "interrupted" in _last_word(c) and "no step recorded" in _last_word(c), c.output
