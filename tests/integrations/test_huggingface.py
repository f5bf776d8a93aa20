"""The Hugging Face Trainer under ``torchlens run -- torchrun`` with no change to
the job: ``TorchlensCallback`` is added when the job imports the
Trainer, one step per optimizer step (gradient accumulation counted as the
Trainer counts it), evaluations and checkpoint saves labelled and left out of
the slow-rank verdict. Real transformers and torchrun, CPU, gloo, a tiny BERT
built from a config (no hub access); figures read from the run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchlens as torchlens_pkg
from tests.ranks.helpers import TORCHRUN, Collector, env, free_port

pytest.importorskip("transformers")
pytestmark = pytest.mark.timeout(300)
SCRIPT = Path(__file__).with_name("hf_train.py")
STEPS_BY = "note: steps: the Hugging Face Trainer's optimizer steps (TorchlensCallback)"

#: torchlens' own package folder (a clone's folder is named torchlens too)
PACKAGE = str(Path(torchlens_pkg.__file__).parent) + os.sep


def _run(tmp_path: Path, **extra: str) -> tuple[Collector, dict[int, list[dict]]]:
    port = free_port()
    command = [TORCHRUN, "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"job{port}", str(SCRIPT),
               str(tmp_path / "trainer")]
    out = tmp_path / "run"
    c = Collector(out, command, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), **extra)
    try:
        assert c.wait() == 0, c.output
    finally:
        c.kill()
    steps = {}
    for r in (0, 1):
        with open(out / f"rank{r}" / "steps.jsonl", encoding="utf-8") as fh:
            steps[r] = [json.loads(line) for line in fh if not json.loads(line).get("window")]
    return c, steps


def _verdict(c: Collector) -> str:
    return next(line for line in c.lines if line.startswith("verdict:"))


def test_trainer_straggler_accumulation_and_labelled_evaluation(tmp_path: Path) -> None:
    # 6 optimizer steps of 4 micro-batches each; evaluation and a checkpoint every 3.
    # 50 ms a batch (200 ms a step): with 6 steps the few-steps rule needs rank 1 late
    # in 80% of them, and at 20 ms a loaded machine once put rank 0 late in one
    c, steps = _run(tmp_path, TL_STEPS="6", TL_ACCUM="4", TL_EVAL_EVERY="3", TL_SLOW_S="0.05")
    assert "not attached" not in c.output and "without TorchlensCallback" not in c.output, (
        c.output)
    verdict = _verdict(c)
    assert "rank 1 is the slow rank" in verdict and "data loading" in verdict, c.output
    assert STEPS_BY in c.output, c.output
    for r in (0, 1):
        labels = [s.get("label") for s in steps[r]]
        # one record per optimizer step, not per micro-batch; after steps 3 and 6
        # the Trainer evaluated, then saved
        assert labels == [None, None, None, "evaluation", "checkpoint",
                          None, None, None, "evaluation", "checkpoint"], labels
        assert [s["step"] for s in steps[r]] == list(range(10))
    # the verdict compared the 6 training steps, not the evaluations
    assert "of 6 steps" in verdict, verdict


def test_a_slow_evaluation_is_not_a_straggler_and_two_callbacks_count_once(
        tmp_path: Path) -> None:
    # rank 1 is slow in its evaluation batches only, evaluated after every step;
    # the script also adds TorchlensCallback itself (one of the two acts)
    c, steps = _run(tmp_path, TL_STEPS="5", TL_EVAL_EVERY="1", TL_SAVE="0", TL_EVAL_SLOW="1",
                    TL_SLOW_S="0.05", TL_CALLBACK="1")
    # the evaluations' data loading is not judged (the training steps, a few ms
    # each on shared cores, may still name a rank for noise: not for data)
    verdict = _verdict(c)
    assert "data loading" not in verdict and "of 5 steps" in verdict or (
        "no slow rank" in verdict), c.output
    assert STEPS_BY in c.output, c.output
    for r in (0, 1):
        assert [s.get("label") for s in steps[r]] == [None, "evaluation"] * 5
        # the evaluations are where rank 1 was slow: the labelled spans hold it
        evals = [s for s in steps[r] if s.get("label")]
        if r == 1:
            assert min(s["phases"]["data"] for s in evals) >= 0.15  # 4 batches of 50 ms


def test_the_live_feed_and_the_watch_carry_every_step(tmp_path: Path) -> None:
    """``live.jsonl`` (what ``torchlens.watch`` reads while the job runs) holds every
    record of each rank's ``steps.jsonl`` once, in order, with evaluations and
    checkpoints (labelled spans, not counted as steps) in most of its frames."""
    import torchlens

    _, steps = _run(tmp_path, TL_STEPS="14", TL_EVAL_EVERY="3", TL_SLOW_S="0.05")
    out = tmp_path / "run"
    live: dict[int, list[dict]] = {0: [], 1: []}
    for line in (out / "live.jsonl").read_text(encoding="utf-8").splitlines():
        for r, records in json.loads(line)["steps"].items():
            live[int(r)] += [x for x in records if not x.get("window")]

    def key(x: dict) -> tuple:
        return x["step"], x.get("label"), x["t0"]

    for r in (0, 1):
        # an evaluation and a save after steps 3, 6, 9, 12 (and at the end)
        assert sum(1 for s in steps[r] if s.get("label")) >= 8
        assert [key(x) for x in live[r]] == [key(x) for x in steps[r]]
    # the watch, replaying the feed, draws each training step once
    w = torchlens.watch(str(out), timeout=30)
    try:
        assert w.wait(30) and w.state == "ended", w.message
        training = [[s["step"] for s in steps[r] if not s.get("label")] for r in (0, 1)]
        assert len(training[0]) == 14
        assert [list(src.data["step"]) for src in w.view.profile.panels.steps] == training
    finally:
        w.stop()


def test_the_trainer_without_torchlens_run_is_untouched(tmp_path: Path) -> None:
    code = ("import sys, transformers.trainer as t; import torchlens; "
            "print([c.__name__ for c in t.DEFAULT_CALLBACKS])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env(), cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "['DefaultFlowCallback']", done.stderr


def test_a_compiled_bf16_trainer_is_followed_with_no_change(tmp_path: Path) -> None:
    # torch_compile=True and bf16=True: one step per optimizer step, the slow
    # rank named for its data loading, each rank's compiles recorded (the
    # model's forward, by torch's records) and no frame of torchlens' among them
    c, steps = _run(tmp_path, TL_STEPS="8", TL_SLOW_S="0.05", TL_COMPILE="1", TL_BF16="1")
    verdict = _verdict(c)
    assert "rank 1 is the slow rank" in verdict and "data loading" in verdict, c.output
    for r in (0, 1):
        assert [s["step"] for s in steps[r]] == list(range(8))
        frames = [f for s in steps[r] for f in (s.get("compiled") or {}).get("frames", [])]
        assert any(f["frame"] == "forward" for f in frames), frames
        assert not [f for f in frames if f["file"].startswith(PACKAGE)], frames
