"""A plain Accelerate loop (``accelerator.prepare``, ``accelerator.backward``,
``optimizer.step()``) that never imports torchlens, under ``torchlens run``
with torchrun and with ``accelerate launch``. No code of torchlens
is Accelerate's: ``AcceleratedOptimizer.step`` calls the wrapped optimizer's
``step``, which torch's global optimizer hook sees, and under
``accelerator.accumulate`` Accelerate skips that call on the micro-batches
that do not sync, so a skipped step is no step. Real frameworks, CPU, gloo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ranks.helpers import BIN, TORCHRUN, Collector, free_port

pytest.importorskip("accelerate")
pytestmark = pytest.mark.timeout(300)
SCRIPT = Path(__file__).with_name("accelerate_train.py")
ITERATIONS, ACCUM = 12, 3


def _check(tmp_path: Path, command: list[str]) -> None:
    out = tmp_path / "run"
    # rank 1 150 ms a batch: in 4 steps the few-steps rule asks for a wait 3x the
    # others' own spread, which a loaded machine pushed to 68 ms against 50 ms a batch
    c = Collector(out, command, TL_STEPS=str(ITERATIONS), TL_ACCUM=str(ACCUM),
                  TL_SLOW_S="0.15", HF_HOME=str(tmp_path / "hf"))
    try:
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    verdict = next(line for line in c.lines if line.startswith("verdict:"))
    assert "rank 1 is the slow rank" in verdict and "data loading" in verdict, c.output
    assert "note: steps: optimizer.step() of SGD" in c.output, c.output
    for r in (0, 1):
        with open(out / f"rank{r}" / "steps.jsonl", encoding="utf-8") as fh:
            steps = [json.loads(line) for line in fh]
        # 12 micro-batches, 3 to an optimizer step: 4 steps, none for a skipped step
        assert [s["step"] for s in steps if not s.get("window")] == list(range(ITERATIONS // ACCUM))


def test_an_accelerate_loop_under_torchrun(tmp_path: Path) -> None:
    port = free_port()
    _check(tmp_path, [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2",
                      "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                      "--rdzv-id", f"job{port}", str(SCRIPT)])


def test_an_accelerate_loop_under_accelerate_launch(tmp_path: Path) -> None:
    # --multi_gpu picks Accelerate's torchrun launcher; the script's
    # Accelerator(cpu=True) keeps it on the CPU with gloo (--cpu would use mpirun)
    _check(tmp_path, [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                      "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend",
                      "no", "--main_process_port", str(free_port()), str(SCRIPT)])
