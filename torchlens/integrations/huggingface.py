"""``TorchlensCallback``: the Hugging Face Trainer's own steps, evaluations and
checkpoint saves, for ``torchlens run`` (docs/integrations/huggingface.md).

``Trainer(..., callbacks=[TorchlensCallback()])``; under ``torchlens run`` it
is added by itself (``autoload``). What it does, by the Trainer's events:

- ``on_step_end`` (once per optimizer step: gradient accumulation of 4 is one
  step for 4 micro-batches, as the Trainer counts ``global_step``) ends a
  training step. The step then ends where the Trainer says rather than at the
  next phase after ``optimizer.step()`` (``capture.ranks.autostep``), which
  the callback turns off, so no step is counted twice.
- ``on_evaluate`` ends the span since the last end as ``evaluation``,
  ``on_save`` as ``checkpoint``: the Trainer evaluates and saves right after
  ``on_step_end``, and without labels those seconds would be the next
  training step's, judged as a slow step.

The data, forward, backward, optimizer and collective phases are timed as in
any job (``capture.ranks.phases``): the Trainer's batches come through a
torch DataLoader (its collator runs in ``data``), its DDP model's forward,
``loss.backward()``, the optimizer that Accelerate wraps.

Two callbacks on one Trainer (one added by hand, one by ``autoload``): the
first on the Trainer's list acts, the other does nothing.

Outside ``torchlens run``, ``%ddp_check --profile`` and ``%%torchprof`` the
callback does nothing.
"""

from __future__ import annotations

import weakref
from typing import Any

import transformers
from transformers import TrainerCallback

from torchlens.integrations import steps
from torchlens.integrations.versions import require

require("transformers", transformers.__version__)

#: how the view says the steps were found (``note: steps: ...``)
STEPS_BY = "the Hugging Face Trainer's optimizer steps (TorchlensCallback)"

#: one acting callback per Trainer state (see the module docstring), by the
#: state's id: a TrainerState is an unhashable dataclass
_acting: dict[int, tuple[weakref.ref[Any], TorchlensCallback]] = {}


class TorchlensCallback(TrainerCallback):
    """Per-step records that follow the Trainer's structure (module docstring)."""

    def _acts(self, state: Any) -> bool:
        held = _acting.get(id(state))
        if held is not None and held[0]() is state:
            return held[1] is self
        for key in [k for k, (ref, _) in _acting.items() if ref() is None]:
            del _acting[key]
        try:
            _acting[id(state)] = (weakref.ref(state), self)
        except TypeError:  # a state without weak references: every callback acts
            pass
        return True

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._acts(state):
            steps.attach_if_run()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._acts(state):
            steps.end_step(STEPS_BY)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._acts(state):
            steps.end_span("evaluation", STEPS_BY)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._acts(state):
            steps.end_span("checkpoint", STEPS_BY)
