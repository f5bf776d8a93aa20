"""PyTorch Lightning under ``torchlens run``: ``TorchlensCallback``
gives one step per optimizer step (``accumulate_grad_batches`` counted as
Lightning counts it), validations labelled and left out of the slow-rank
verdict, and a rank whose DataLoader is slow named for its data loading, under
torchrun and under Lightning's own DDP launcher (which starts its ranks itself
and sets no RANK). Real Lightning, strategy="ddp", 2 CPU processes, gloo;
figures read from the run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import torchlens as torchlens_pkg
from tests.ranks.helpers import TORCHRUN, Collector, env, free_port

pytest.importorskip("lightning")
pytestmark = pytest.mark.timeout(300)
SCRIPT = Path(__file__).with_name("lightning_train.py")
STEPS_BY = "note: steps: Lightning's optimizer steps (TorchlensCallback)"
# 6 optimizer steps of 2 batches; a validation every 6 batches (after steps 3 and 6)
JOB = {"TL_STEPS": "6", "TL_ACCUM": "2", "TL_VAL_EVERY": "6", "TL_SLOW_S": "0.15"}
LABELS = [None, None, None, "validation", None, None, None, "validation"]

#: torchlens' own package folder (a clone's folder is named torchlens too)
PACKAGE = str(Path(torchlens_pkg.__file__).parent) + os.sep


def _run(tmp_path: Path, launcher: list[str],
         **extra: str) -> tuple[Collector, dict[int, list[dict]]]:
    out = tmp_path / "run"
    c = Collector(out, [*launcher, str(SCRIPT), str(tmp_path / "lightning")], **JOB, **extra)
    try:
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    steps = {}
    for r in (0, 1):
        with open(out / f"rank{r}" / "steps.jsonl", encoding="utf-8") as fh:
            steps[r] = [json.loads(line) for line in fh if not json.loads(line).get("window")]
    return c, steps


def _check(c: Collector, steps: dict[int, list[dict]], labels: list = LABELS) -> None:
    verdict = next(line for line in c.lines if line.startswith("verdict:"))
    assert "rank 1 is the slow rank" in verdict and "data loading" in verdict, c.output
    assert "of 6 steps" in verdict, verdict  # the training steps, not the validations
    assert STEPS_BY in c.output, c.output
    for r in (0, 1):
        assert [s.get("label") for s in steps[r]] == labels, steps[r]
        assert [s["step"] for s in steps[r]] == list(range(len(labels)))
    # one step is 2 batches of rank 1's 50 ms data loading; the first step is left
    # out: Lightning fetches its first batch as the loop starts, which can fall
    # before the first step begins
    train = [s for s in steps[1] if not s.get("label")][1:]
    assert min(s["phases"]["data"] for s in train) >= 0.09, train


def test_lightning_under_torchrun_names_the_straggler(tmp_path: Path) -> None:
    port = free_port()
    c, steps = _run(tmp_path, [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint",
                               f"127.0.0.1:{port}", "--rdzv-id", f"job{port}"])
    _check(c, steps)


def _torchrun() -> list[str]:
    port = free_port()
    return [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job{port}"]


def test_a_script_without_the_callback_gets_it_under_torchlens_run(tmp_path: Path) -> None:
    """No torchlens in the script: Lightning's callbacks_factory entry point adds
    the callback; the checkpoint saved after each validation is labelled."""
    c, steps = _run(tmp_path, _torchrun(), TL_CALLBACK="0", TL_CKPT="1")
    _check(c, steps, [None, None, None, "validation", "checkpoint",
                      None, None, None, "validation", "checkpoint"])
    assert list((tmp_path / "lightning").rglob("*.ckpt")), "the job's own checkpoints"


def test_a_pytorch_lightning_script_gets_it_under_torchlens_run(tmp_path: Path) -> None:
    """The same job written against the older ``pytorch_lightning`` distribution
    (``import pytorch_lightning as pl``), no torchlens in it."""
    pytest.importorskip("pytorch_lightning")
    c, steps = _run(tmp_path, _torchrun(), TL_CALLBACK="0", TL_PACKAGE="pytorch_lightning")
    _check(c, steps)


def test_lightnings_own_ddp_launcher_attaches_every_rank(tmp_path: Path) -> None:
    """``torchlens run -- python train.py``: Lightning starts rank 1 itself and
    rank 0 is the process torchlens started; neither has RANK when it starts."""
    c, steps = _run(tmp_path, [sys.executable])
    assert "ranks: 2 of 2 attached" in c.output, c.output
    _check(c, steps)
    # the walk: the node column read "-" (no GROUP_RANK without torchrun): node 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert [e["node"] for e in manifest["ranks"]] == [0, 0], manifest["ranks"]


def test_lightnings_own_launcher_adds_the_callback_to_a_script_without_it(tmp_path) -> None:
    """The same with no torchlens in the script: the launcher's own process
    gets Lightning's callbacks factory, and each rank attaches at set-up."""
    c, steps = _run(tmp_path, [sys.executable], TL_CALLBACK="0")
    assert "ranks: 2 of 2 attached" in c.output, c.output
    _check(c, steps)


def test_importing_torchlens_and_its_integrations_imports_no_lightning() -> None:
    code = ("import sys, torchlens, torchlens.integrations; "
            "print([m for m in ('lightning', 'pytorch_lightning') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env())
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_outside_torchlens_run_the_callback_changes_nothing(monkeypatch) -> None:
    from torchlens.integrations.lightning import TorchlensCallback

    monkeypatch.delenv("TORCHLENS_COLLECTOR", raising=False)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHLENS_ATTACHED"):
        monkeypatch.delenv(name, raising=False)
    trainer = SimpleNamespace(global_rank=1, world_size=2, local_rank=1, global_step=0)
    cb = TorchlensCallback()
    cb.setup(trainer, None, "fit")
    cb.on_train_start(trainer, None)
    trainer.global_step = 1
    cb.on_train_batch_end(trainer, None, None, None, 0)
    cb.on_validation_end(trainer, None)
    assert "RANK" not in os.environ and "TORCHLENS_ATTACHED" not in os.environ


def test_an_old_lightning_gets_one_line() -> None:
    from torchlens.integrations.lightning import too_old

    assert too_old("2.6.6") is None
    said = too_old("1.9.5")
    assert said is not None and "\n" not in said
    assert "lightning 1.9.5" in said and "pip install 'lightning>=2.0'" in said


def test_a_compiled_bf16_module_is_followed_with_no_change(tmp_path: Path) -> None:
    # precision="bf16-mixed" and a module under torch.compile: the same steps,
    # labels and slow rank as in eager float32, each rank's compiles recorded
    # (torch's records: the network's forward) and none of torchlens' own frames
    c, steps = _run(tmp_path, _torchrun(), TL_COMPILE="1", TL_BF16="1")
    _check(c, steps)
    for r in (0, 1):
        frames = [f for s in steps[r] for f in (s.get("compiled") or {}).get("frames", [])]
        assert frames, steps[r][:2]
        assert not [f for f in frames if f["file"].startswith(PACKAGE)], frames
