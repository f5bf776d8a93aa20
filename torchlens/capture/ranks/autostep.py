"""Steps found from the job's own optimizer, for a script that never calls
``torchlens.step()`` (``torchlens run`` with no import, ``%ddp_check --profile``).

Torch's global optimizer post-hook (``torch.optim.optimizer.
register_optimizer_step_post_hook``, called after every ``Optimizer.step``
of every optimizer) marks a boundary. The step is cut at the next phase the
job enters (``PhaseClock.enter``: the next batch, forward, backward or
optimizer step), not inside the hook: a script that calls
``torchlens.step()`` right after ``opt.step()`` gets there first, and its
call wins (``RankProfiler.step`` turns this source off), so nothing is
counted twice. What comes after the optimizer in a loop (logging,
``loss.item()``) stays in its step. The last step is cut at the time of its
optimizer step when the job ends (what follows is teardown).

Several optimizers (a GAN's generator and discriminator): one step per
iteration, ended by the optimizer that stepped first; its steps alone count.
When that optimizer is gone (garbage collected: a job that builds a new one),
the next optimizer to step takes its place. Gradient accumulation needs
nothing: there is one optimizer step per accumulated step.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

#: how ``steps_by`` names each way steps were found
EXPLICIT = "torchlens.step()"


def optimizer_words(name: str) -> str:
    return f"optimizer.step() of {name}"


def window_words(window_s: float) -> str:
    return f"fixed {window_s:g} s windows (no torchlens.step() and no optimizer.step() seen)"


class OptimizerBoundary:
    """Marks a pending step end at each step of the job's (first) optimizer.

    ``pending``: when the step optimizer last stepped and no cut has taken
    it yet (unix seconds), else None. ``off`` after the script called
    ``torchlens.step()``.
    """

    def __init__(self) -> None:
        self.pending: float | None = None
        self.off = False
        self.name: str | None = None  # the step optimizer's class
        self._opt: weakref.ref[Any] | None = None
        self._undo: Callable[[], None] | None = None

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._undo = register_optimizer_step_post_hook(self.stepped).remove

    def remove(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None

    def stepped(self, opt: Any, *_: Any) -> None:
        """``opt`` stepped (torch's optimizer hook), or would have but for a
        loss scaler that skipped it (``capture.trace.scaler``): a step ends."""
        if self.off:
            return
        current = self._opt() if self._opt is not None else None
        if current is None:
            try:
                self._opt = weakref.ref(opt)
            except TypeError:  # an optimizer without weakref support: held
                self._opt = lambda o=opt: o  # type: ignore[assignment]
            current, self.name = opt, type(opt).__name__
        if opt is current:
            self.pending = time.time()

    def take(self) -> float | None:
        """The pending boundary's time, now taken; None when there is none."""
        t, self.pending = self.pending, None
        return t
