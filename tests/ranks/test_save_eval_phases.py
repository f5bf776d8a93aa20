"""The save and eval phases of a rank's step clock: torch.save and an
evaluation (a forward under no_grad / inference_mode) are timed apart from
training work, fail open (a broken hook leaves the user's call as it was),
and come off when the clock is removed."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from torchlens.capture.ranks.phases import PHASES, PhaseClock
from torchlens.model.records import StepRecord


@pytest.fixture
def clock():
    c = PhaseClock()
    c.install()
    yield c
    c.remove()


def test_torch_save_is_timed_as_a_save(clock, tmp_path) -> None:
    clock.take()
    real_save = torch.save.__wrapped__
    torch.save({"w": torch.zeros(8)}, tmp_path / "a.pt")
    time.sleep(0.02)  # a sleep is no save
    spent = clock.take()
    assert 0 < spent["save"] < 0.02
    assert torch.load(tmp_path / "a.pt")["w"].shape == (8,)
    clock.remove()
    assert torch.save is real_save and torch.serialization.save is real_save


def test_a_raising_hook_leaves_torch_save_working(clock, tmp_path, monkeypatch) -> None:
    def broken(*_):
        raise RuntimeError("torchlens' own bug")

    monkeypatch.setattr(clock, "_save_begin", broken)
    torch.save({"w": torch.ones(3)}, tmp_path / "b.pt")
    assert torch.load(tmp_path / "b.pt")["w"].sum() == 3
    assert clock.hook_errors == 1 and "torchlens' own bug" in clock.hook_error
    # a hook that breaks when the save ends: the save happened, nothing raised
    monkeypatch.undo()
    monkeypatch.setattr(clock, "_save_end", broken)
    torch.save({"w": torch.ones(2)}, tmp_path / "c.pt")
    assert torch.load(tmp_path / "c.pt")["w"].sum() == 2
    assert clock.hook_errors == 2 and clock.active == -1


def test_the_users_own_save_error_reaches_the_user_unchanged(clock, tmp_path) -> None:
    with pytest.raises(RuntimeError, match="does not exist") as raised:
        torch.save({}, tmp_path / "no such dir" / "x.pt")
    assert raised.value.__context__ is None  # torch's error alone, not chained to one of ours
    assert clock.active == -1 and clock.hook_errors == 0


def test_a_forward_under_no_grad_is_an_evaluation(clock) -> None:
    model = nn.Linear(4, 2)
    clock.take()
    with torch.no_grad():
        model(torch.randn(3, 4))
        time.sleep(0.02)
    spent = clock.take()
    assert spent["eval"] >= 0.02
    with torch.inference_mode():
        model(torch.randn(3, 4))
    assert clock.take()["eval"] > 0


def test_no_grad_work_without_a_module_is_no_evaluation(clock) -> None:
    w = torch.zeros(4, requires_grad=True)
    clock.take()
    with torch.no_grad():  # a parameter edit, gradient clipping: no module runs
        w.add_(1.0)
        time.sleep(0.01)
    assert clock.take()["eval"] == 0.0
    assert torch.is_grad_enabled()  # grad mode restored


class _SlowSet(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.02)
        return torch.randn(4)


def test_an_evaluations_batches_stay_data_and_the_rest_is_eval(clock) -> None:
    """A validation loader's wait stays in data (where the input-bound and slow-rank
    rules look for it); the forwards and the rest of the block are the evaluation."""
    loader = torch.utils.data.DataLoader(_SlowSet(), batch_size=1)
    model = nn.Linear(4, 2)
    clock.take()
    with torch.no_grad():
        for x in loader:
            model(x)
        time.sleep(0.03)
    spent = clock.take()
    assert spent["data"] >= 0.04
    assert 0.03 <= spent["eval"] < 0.04 + 0.01


def test_a_raising_eval_hook_leaves_no_grad_working(clock, monkeypatch) -> None:
    def broken(*_):
        raise RuntimeError("torchlens' own bug")

    model = nn.Linear(2, 2)
    monkeypatch.setattr(clock, "_block_enter", broken)
    monkeypatch.setattr(clock, "_block_exit", broken)
    with torch.no_grad():
        assert not torch.is_grad_enabled()
        y = model(torch.ones(1, 2))
    assert torch.is_grad_enabled() and not y.requires_grad
    assert clock.hook_errors == 2


def test_removed_hooks_leave_grad_modes_as_torch_has_them(clock) -> None:
    from torch.autograd import grad_mode

    clock.remove()
    assert not hasattr(grad_mode.no_grad.__enter__, "__wrapped__")
    assert not hasattr(grad_mode.inference_mode.__exit__, "__wrapped__")
    assert not getattr(torch.save, "_torchlens_save", False)


def test_old_records_without_the_new_phases_still_decode() -> None:
    line = ('{"step": 3, "t0": 1.0, "t1": 1.5, "phases": {"data": 0.1, "forward": 0.1, '
            '"backward": 0.1, "optimizer": 0.05, "collective": 0.0}}')
    rec = StepRecord.from_json(line)
    assert "save" not in rec.phases and rec.phases["data"] == 0.1
    assert {"save", "eval"} <= set(PHASES)


def test_a_timed_forward_under_no_grad_is_the_evaluations(clock) -> None:
    """DDP's forward (a timed phase) run under no_grad counts as eval, not forward."""
    model = nn.Linear(4, 2)
    ddp_forward = clock._wrap(PHASES.index("forward"), model)
    clock.take()
    with torch.no_grad():
        ddp_forward(torch.randn(2, 4))
    spent = clock.take()
    assert spent["forward"] == 0.0 and spent["eval"] > 0
    ddp_forward(torch.randn(2, 4))  # with grad on: training
    spent = clock.take()
    assert spent["forward"] > 0 and spent["eval"] == 0.0
