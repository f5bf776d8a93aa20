"""Mixed precision's loss scaler on a rank: the optimizer steps
``torch.amp.GradScaler`` skipped for inf/nan gradients, and its scale.

``GradScaler.step(optimizer)`` runs the optimizer only when no gradient was
inf or nan (it reads each device's ``found_inf`` with ``.item()``, a wait for
the device it already makes), and ``update()`` then lowers the scale after a
skipped step and raises it after ``growth_interval`` good ones. A float16 job
whose forward overflows now and then loses those steps without a word, and a
scale that keeps falling says the overflow does not go away.

``ScalerSteps.install`` wraps ``GradScaler.step`` (every scaler class, the
CUDA and CPU ones derive from it): after the original returns, it reads the
``found_inf`` values the original just waited for, and the scale this step
used (``_scale``, computed by the previous ``update()``: complete by now, so
reading it waits for nothing more). The scale the scaler holds after this
step's ``update()`` follows from GradScaler's own rule (times
``backoff_factor`` after a skip, times ``growth_factor`` after
``growth_interval`` good steps in a row; its growth tracker is read once, at
the first step), so no read waits for ``update()``. ``take`` at each step's
end gives the step's ``ScalerStep``. Fails open: torchlens' own error is counted, the
user's step goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchlens.model.records import ScalerStep


class ScalerSteps:
    """GradScaler's optimizer steps and skips per training step (module docstring)."""

    def __init__(self) -> None:
        self.errors = 0
        self._steps = self._skipped = 0
        self._total_steps = self._total_skipped = 0
        self._scale: float | None = None
        self._first_scale: float | None = None
        self._next_scale: float | None = None
        self._good: int | None = None  # good steps in a row, as the scaler's tracker
        self._undo: Any = None
        #: called with the optimizer of a skipped step (the step still ended)
        self.on_skip: Callable[[Any], None] | None = None

    def install(self) -> None:
        try:
            self._install()
        except Exception:  # noqa: BLE001 - torchlens' own error: no scaler figures, the job runs
            self.errors += 1

    def _install(self) -> None:
        try:
            from torch.amp.grad_scaler import GradScaler
        except ImportError:  # a torch without it: nothing to watch
            return
        original = GradScaler.__dict__.get("step")
        if original is None or getattr(original, "_torchlens_scaler", False):
            return
        me = self

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(scaler, optimizer, *args, **kwargs)
            me._stepped(scaler, optimizer)
            return out

        step._torchlens_scaler = True  # type: ignore[attr-defined]
        step.__wrapped__ = original  # type: ignore[attr-defined]
        step.__doc__ = original.__doc__
        GradScaler.step = step
        self._undo = lambda: setattr(GradScaler, "step", original)

    def remove(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None

    def _stepped(self, scaler: Any, optimizer: Any) -> None:
        try:
            if not getattr(scaler, "_enabled", True):
                return
            state = scaler._per_optimizer_states.get(id(optimizer))
            found = state.get("found_inf_per_device") if state else None
            if not found:
                return
            skipped = sum(float(v.item()) for v in found.values()) > 0
            scale = getattr(scaler, "_scale", None)
            self._scale = float(scale.item()) if scale is not None else None
            if self._first_scale is None:
                self._first_scale = self._scale
            self._next_scale = self._after_update(scaler, skipped)
            self._steps += 1
            self._total_steps += 1
            if skipped:
                self._skipped += 1
                self._total_skipped += 1
                if self.on_skip is not None:
                    self.on_skip(optimizer)
        except Exception:  # noqa: BLE001 - torchlens' own error: the user's step went on
            self.errors += 1

    def _after_update(self, scaler: Any, skipped: bool) -> float | None:
        """The scale ``update()`` leaves after this step (module docstring)."""
        if self._scale is None:
            return None
        if self._good is None:
            tracker = getattr(scaler, "_growth_tracker", None)
            self._good = int(tracker.item()) if tracker is not None else 0
        if skipped:
            self._good = 0
            return self._scale * float(getattr(scaler, "_backoff_factor", 0.5))
        self._good += 1
        if self._good >= int(getattr(scaler, "_growth_interval", 2000)):
            self._good = 0
            return self._scale * float(getattr(scaler, "_growth_factor", 2.0))
        return self._scale

    def take(self) -> ScalerStep | None:
        """The scaler's steps since the last call (None: it made none)."""
        if not self._steps:
            return None
        out = ScalerStep(steps=self._steps, skipped=self._skipped, scale=self._scale,
                         total_steps=self._total_steps, total_skipped=self._total_skipped,
                         first_scale=self._first_scale, next_scale=self._next_scale)
        self._steps = self._skipped = 0
        return out
