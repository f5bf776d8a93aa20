"""The pieces of ``torchlens.integrations`` that need no training job: importing
torchlens imports no framework, the post-import hook, the version check, the
slow-rank verdict leaving labelled spans out, and the stepper's labels."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from tests.ranks.helpers import REPO, env
from torchlens.analysis.ranks.slow import slow_rank
from torchlens.integrations import autoload, versions
from torchlens.model.records import StepRecord


def test_importing_torchlens_imports_no_framework() -> None:
    code = ("import sys, torchlens, torchlens.integrations.autoload, "
            "torchlens.integrations.steps, torchlens.frontends.cli.main; "
            "print(sorted(m for m in ('transformers', 'accelerate', 'lightning') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env(), cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_the_hook_adds_the_callback_only_when_the_trainer_module_is_imported(
        tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "fakehf"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text("DEFAULT_CALLBACKS = ['flow']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    hook = autoload.AfterImport("fakehf.trainer", lambda m: seen.append(list(m.DEFAULT_CALLBACKS)))
    sys.meta_path.insert(0, hook)
    try:
        import fakehf  # noqa: F401 - the package alone: nothing yet

        assert seen == [] and hook in sys.meta_path
        import fakehf.trainer

        assert seen == [["flow"]]  # after the module's own code ran
        assert hook not in sys.meta_path  # once
        assert fakehf.trainer.__spec__.loader.get_source("fakehf.trainer").startswith("DEFAULT")
    finally:
        hook.remove()
        for name in ("fakehf.trainer", "fakehf"):
            sys.modules.pop(name, None)


def test_an_old_transformers_gets_one_line_and_an_untouched_trainer(monkeypatch, capsys) -> None:
    fake = types.ModuleType("transformers")
    fake.__version__ = "4.30.2"
    monkeypatch.setitem(sys.modules, "transformers", fake)
    trainer = types.SimpleNamespace(DEFAULT_CALLBACKS=["flow"])
    autoload.add_trainer_callback(trainer)  # type: ignore[arg-type]
    assert trainer.DEFAULT_CALLBACKS == ["flow"]
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "transformers 4.30.2 is older than the 4.40" in lines[0]
    assert "pip install 'transformers>=4.40'" in lines[0]
    # imported by hand, the callback module refuses in the same words
    with pytest.raises(versions.UnsupportedVersion, match="4.30.2 is older"):
        versions.require("transformers", "4.30.2")
    assert versions.message("transformers", "4.40.0.dev0") is None
    assert versions.message("accelerate", "0.29.3") is not None


def _steps(data_s: dict[int, list[float]], labels: list[str | None]) -> list[list[StepRecord]]:
    """Two ranks' records: rank r's data time per step; others wait in backward."""
    out = []
    for datas in data_s.values():
        recs = []
        for i, (d, label) in enumerate(zip(datas, labels, strict=True)):
            worst = max(x[i] for x in data_s.values())
            phases = {"data": d, "forward": 0.01, "backward": 0.005 + worst - d,
                      "optimizer": 0.001, "collective": 0.0}
            recs.append(StepRecord(step=i, t0=i, t1=i + 0.02 + worst, phases=phases,
                                   **({"label": label} if label else {})))
        out.append(recs)
    return out


def test_labelled_spans_are_not_compared_by_the_slow_rank_verdict() -> None:
    # rank 1 loads its evaluation batches slowly: every other span is evaluation
    labels = [None, "evaluation"] * 6
    data = {0: [0.0] * 12, 1: [0.0 if lab is None else 0.2 for lab in labels]}
    verdict = slow_rank(_steps(data, labels))
    assert verdict.rank is None and verdict.steps == 6, verdict.finding.text
    # the same spans unlabelled: rank 1 is called slow for its data loading
    unlabelled = slow_rank(_steps(data, [None] * 12))
    assert unlabelled.rank == 1 and unlabelled.cause == "data"


def test_a_labelled_record_keeps_its_label_and_an_unlabelled_one_its_bytes() -> None:
    rec = StepRecord(step=3, t0=1.0, t1=2.0, label="checkpoint")
    assert StepRecord.from_json(rec.to_json()).label == "checkpoint" and rec.labelled
    plain = StepRecord(step=3, t0=1.0, t1=2.0)
    assert "label" not in plain.to_json() and not plain.labelled


def test_the_callbacks_steps_replace_the_optimizers_and_label_the_spans(tmp_path) -> None:
    """In one process, as the Trainer calls them: per optimizer step (after 4
    micro-batches) ``end_step``; after the second, an evaluation then a
    checkpoint. The optimizer hook ends nothing more."""
    import torch

    from torchlens.capture.ranks.stepper import RankProfiler
    from torchlens.integrations import steps

    prof = RankProfiler(rank=0, run_dir=str(tmp_path), device=None, every=10_000)
    prof.start()
    try:
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(3):
            for _ in range(4):  # gradient accumulation: one optimizer step in 4
                model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            steps.end_step("the Trainer")
            if i == 1:
                model(torch.randn(4, 8)).sum().backward()  # an evaluation's phases
                steps.end_span("evaluation", "the Trainer")
                steps.end_span("checkpoint", "the Trainer")
    finally:
        prof.finish(wait_s=1.0)
    records, _ = prof.drain()
    assert [(r.step, r.label or None) for r in records if not r.window] == [
        (0, None), (1, None), (2, "evaluation"), (3, "checkpoint"), (4, None)]
    assert prof.status().steps_by == "the Trainer"


def test_inside_torchprof_a_training_step_is_a_step_and_a_span_is_not(monkeypatch) -> None:
    from torchlens.capture.trace import profiler
    from torchlens.integrations import steps

    class Capture:
        calls = 0

        def step(self) -> None:
            Capture.calls += 1

    capture = Capture()
    profiler.attach_stepper(capture)
    try:
        steps.end_step("the Trainer")
        steps.end_span("evaluation", "the Trainer")
    finally:
        profiler.detach_stepper(capture)
    assert Capture.calls == 1


def test_a_trainer_module_without_default_callbacks_gets_one_line(capsys) -> None:
    autoload.add_trainer_callback(types.ModuleType("transformers.trainer"))
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(
        "torchlens: the Hugging Face Trainer runs without TorchlensCallback: AttributeError")
