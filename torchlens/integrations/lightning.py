"""``TorchlensCallback``: PyTorch Lightning's own steps and validations, for
``torchlens run`` (docs/integrations/lightning.md).

``Trainer(..., callbacks=[TorchlensCallback()])``. What it does, by Lightning's hooks:

- ``setup`` (every rank, once Lightning's strategy has started the process
  group) attaches the rank under ``torchlens run``. Lightning's own DDP
  launcher (``strategy="ddp"`` run as ``python train.py``) starts its ranks
  itself and sets no ``RANK``: its rank 0 is the process ``torchlens run``
  started and its other ranks carry only ``LOCAL_RANK``, so none attached
  when it started. The callback gives ``RANK`` (and ``WORLD_SIZE``,
  ``LOCAL_RANK``) from the Trainer, which knows them by then, and marks the
  process attached, so a DataLoader worker it spawns does not attach too.
- ``on_train_batch_end`` ends a training step when the Trainer's
  ``global_step`` moved: once per optimizer step (``accumulate_grad_batches=4``
  is one step for 4 batches, as Lightning counts it). The optimizer's own step
  boundary (``capture.ranks.autostep``) is then off, so no step counts twice.
- ``on_validation_end`` ends the span since the last end as ``validation``
  (the sanity check before training too): a validation is longer than a
  training step by design, and without the label it would be judged as a slow
  step.
- ``on_save_checkpoint`` (every rank, as ``ModelCheckpoint`` or
  ``trainer.save_checkpoint`` assembles a checkpoint, before writing it) begins
  a span labelled ``checkpoint``; it ends where the job next enters a phase
  (Lightning's barrier after the write, or the next batch), or at
  ``on_train_end`` after the last step.

Under ``torchlens run`` the callback is added by itself (``lightning_autoload``).

Outside ``torchlens run`` and ``%ddp_check --profile`` it does nothing.
"""

from __future__ import annotations

import importlib
import os
import weakref
from typing import Any

from torchlens.integrations import steps
from torchlens.integrations.versions import UnsupportedVersion, parse

OLDEST = (2, 0)


def _distributions() -> list[tuple[str, type]]:
    """(version, ``Callback``) of each Lightning distribution installed: ``lightning``
    (``lightning.pytorch``) and the older ``pytorch_lightning``, which ships the
    same code under its own names, classes and callbacks-factory group."""
    found = []
    for root, package in (("lightning", "lightning.pytorch"),
                          ("pytorch_lightning", "pytorch_lightning")):
        try:
            version = importlib.import_module(root).__version__
            found.append((version, importlib.import_module(package).Callback))
        except ImportError:
            continue
    if not found:
        raise ImportError("torchlens.integrations.lightning needs Lightning: "
                          "pip install 'lightning>=2.0'")
    return found


def too_old(version: str) -> str | None:
    """The one line saying this Lightning is older than supported, or None."""
    if parse(version)[:2] >= OLDEST:
        return None
    return (f"torchlens: lightning {version} is older than the 2.0 the torchlens "
            "integration supports: pip install 'lightning>=2.0'")


_FOUND = _distributions()
for _version, _ in _FOUND:
    if (_said := too_old(_version)) is not None:
        raise UnsupportedVersion(_said)

#: how the view says the steps were found (``note: steps: ...``)
STEPS_BY = "Lightning's optimizer steps (TorchlensCallback)"
#: what sitecustomize reads to leave a process the rank started alone
_ATTACHED = "TORCHLENS_ATTACHED"

#: one acting callback per Trainer (two added by hand must not end a step twice)
_acting: weakref.WeakKeyDictionary[Any, TorchlensCallback] = weakref.WeakKeyDictionary()


def _rank_env(trainer: Any) -> None:
    """RANK, WORLD_SIZE and LOCAL_RANK from the Trainer where the launcher set none."""
    env = os.environ
    for name, value in (("RANK", trainer.global_rank), ("WORLD_SIZE", trainer.world_size),
                        ("LOCAL_RANK", trainer.local_rank)):
        env.setdefault(name, str(value))
    env.setdefault(_ATTACHED, str(os.getpid()))


class TorchlensCallback(*(callback for _, callback in _FOUND)):  # type: ignore[misc]
    """Per-step records that follow Lightning's structure (module docstring).

    One class for both distributions: where ``lightning`` and ``pytorch_lightning``
    are both installed it subclasses both ``Callback`` classes (the same code
    under two names, no state of their own), so either Trainer takes it as its
    own and a job written against either needs one name."""

    def __init__(self) -> None:
        super().__init__()
        self._global_step = 0

    def _acts(self, trainer: Any) -> bool:
        try:
            return _acting.setdefault(trainer, self) is self
        except TypeError:  # a trainer without weak references or a hash: every callback acts
            return True

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._acts(trainer) and os.environ.get("TORCHLENS_COLLECTOR"):
            _rank_env(trainer)
            steps.attach_if_run()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._global_step = trainer.global_step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._acts(trainer) or trainer.global_step == self._global_step:
            return  # a batch whose gradients were only accumulated
        self._global_step = trainer.global_step
        steps.end_step(STEPS_BY)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._acts(trainer):
            steps.end_span("validation", STEPS_BY)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        # called as the checkpoint is assembled, before it is written: the span
        # ends where the job next enters a phase (the barrier after the write)
        if self._acts(trainer):
            steps.end_span_at_next_phase("checkpoint", STEPS_BY)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._acts(trainer):
            steps.end_pending()  # a checkpoint saved after the last step
