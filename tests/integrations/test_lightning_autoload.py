"""Lightning's callbacks-factory entry point under ``torchlens run``:
a Trainer gets exactly one ``TorchlensCallback`` whether or not the user added
one, none outside ``torchlens run``, and nothing is seen or imported before
``autoload`` installs the finder. Real Lightning Trainers, built, not fitted."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.ranks.helpers import env

pytest.importorskip("lightning")


@pytest.fixture
def factory() -> Iterator[None]:
    from torchlens.integrations import lightning_autoload

    before = list(sys.meta_path)
    lightning_autoload.install()
    yield
    sys.meta_path[:] = before


def _ours(trainer) -> int:
    from torchlens.integrations.lightning import TorchlensCallback

    return sum(isinstance(cb, TorchlensCallback) for cb in trainer.callbacks)


def _trainer(callbacks: list, package: str = "lightning.pytorch"):
    pl = pytest.importorskip(package)

    return pl.Trainer(accelerator="cpu", devices=1, callbacks=callbacks, logger=False,
                      enable_progress_bar=False, enable_model_summary=False)


def test_a_trainer_gets_one_callback_under_torchlens_run(factory, monkeypatch) -> None:
    from torchlens.integrations.lightning import TorchlensCallback

    monkeypatch.setenv("TORCHLENS_COLLECTOR", "127.0.0.1:1")
    assert _ours(_trainer([])) == 1
    mine = TorchlensCallback()
    trainer = _trainer([mine])
    assert _ours(trainer) == 1 and mine in trainer.callbacks  # the user's, not doubled
    # checkpoint callbacks stay last, as Lightning orders them
    assert type(trainer.callbacks[-1]).__name__ == "ModelCheckpoint"


def test_outside_torchlens_run_the_factory_adds_nothing(factory, monkeypatch) -> None:
    monkeypatch.delenv("TORCHLENS_COLLECTOR", raising=False)
    assert _ours(_trainer([])) == 0


def test_the_entry_point_exists_only_once_installed_and_imports_no_lightning() -> None:
    code = ("import sys; from importlib.metadata import entry_points as e; "
            "gs = ('lightning.pytorch.callbacks_factory', 'pytorch_lightning.callbacks_factory'); "
            "n = sum(len(e(group=g)) for g in gs); "
            "from torchlens.integrations import autoload; autoload.install(); "
            "print(n, [p.value for g in gs for p in e(group=g)], "
            "[m for m in ('lightning', 'pytorch_lightning') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(" ", 1) == [
        "0", "['torchlens.integrations.lightning_autoload:callbacks', "
        "'torchlens.integrations.lightning_autoload:callbacks'] []\n"], done.stdout


def test_a_pytorch_lightning_trainer_gets_the_callback_too(factory, monkeypatch) -> None:
    """The older ``pytorch_lightning`` distribution: its own Trainer, its own
    ``Callback`` class and its own callbacks-factory group; the user's callback
    added by hand is one of its callbacks too (not doubled)."""
    from torchlens.integrations.lightning import TorchlensCallback

    monkeypatch.setenv("TORCHLENS_COLLECTOR", "127.0.0.1:1")
    assert _ours(_trainer([], "pytorch_lightning")) == 1
    mine = TorchlensCallback()
    trainer = _trainer([mine], "pytorch_lightning")
    assert _ours(trainer) == 1 and mine in trainer.callbacks
