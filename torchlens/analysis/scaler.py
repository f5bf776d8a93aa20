"""Mixed precision's loss scaler: the optimizer steps ``torch.amp.GradScaler``
skipped for inf/nan gradients, as one finding for a cell or a job's ranks.

The scaler skips an optimizer step whose gradients hold an inf or a nan and
lowers its scale. Its first steps find the scale that fits (a few skips at the
start), and each growth of the scale (every 2,000 good steps by default) may
cost one: ``MIN_SKIPS`` (2) or more skips in the steps judged is an overflow
that keeps coming back, and those steps train nothing. A single skip is said,
as normal. Every skipped step: training has stopped. A scale that fell below
1 over a whole run says the same however the skips fall in the last window:
an overflow at scale 1 is in the gradients themselves.

The scale said "now" is the one the scaler holds after the last step's
``update()`` (``ScalerStep.next_scale``), what ``scaler.get_scale()`` returns.
"""

from __future__ import annotations

from torchlens.model.findings import (
    FAILED,
    INFO,
    SKIPPED_STEPS,
    WARNING,
    Figure,
    Finding,
)
from torchlens.model.records import ScalerStep

#: skipped optimizer steps in the steps judged that make a warning (module docstring)
MIN_SKIPS = 2

ADVICE = ("find what overflows float16: inputs or activations out of range (unnormalised "
          "inputs, a learning rate too high); bfloat16 has float32's range and needs no "
          "scaler")


def scale_words(value: float) -> str:
    """A loss scale as read: 65,536; 0.0156 (a scale under 1 is no whole number)."""
    return f"{value:,.0f}" if value >= 1 else f"{value:.3g}"


def scale_now(s: ScalerStep) -> float | None:
    """The scale the scaler holds after the last step (``next_scale``; an older
    record's ``scale``, the one that step used)."""
    return s.next_scale if s.next_scale is not None else s.scale


def collapsed(s: ScalerStep) -> bool:
    """Whether the scale fell below 1 with ``MIN_SKIPS`` or more skips (module docstring)."""
    now = scale_now(s)
    return s.total_skipped >= MIN_SKIPS and now is not None and now < 1


def skipped_finding(skipped: int, taken: int, last: ScalerStep, *, steps_words: str,
                    who: str = "", shared: str = "", ranks: list[int] | None = None,
                    ) -> Finding | None:
    """The finding for ``skipped`` of ``taken`` optimizer steps skipped, the
    scaler's state after them being ``last``; None when none was skipped.

    ``steps_words`` names the steps judged ("the last 60", "the cell's 20"),
    ``who`` where ("on rank 1", "" for a cell), ``shared`` what else the reader
    must know, ``ranks`` the ranks it names (a job's finding)."""
    if skipped <= 0:
        return None
    since = (f"; {last.total_skipped} of {last.total_steps:,} since the start"
             if last.total_steps > taken else "")
    now = scale_now(last)
    scale = (f", scale {scale_words(last.first_scale)} -> {scale_words(now)}"
             if last.first_scale is not None and now is not None else "")
    every = skipped == taken
    if every:
        severity, then = FAILED, ("training has stopped (the scale fell with each skip and "
                                  "the gradients are still inf or nan)")
    elif collapsed(last):
        severity, then = WARNING, ("the scale fell below 1: the overflow keeps coming back, "
                                   "and the skipped steps train nothing")
    elif skipped >= MIN_SKIPS:
        severity, then = WARNING, "those steps train nothing"
    else:
        severity, then = INFO, ("one skip is how the scaler finds its scale (at the start, "
                                "and when it grows the scale): normal unless it recurs")
    where = f" {who}" if who else ""
    return Finding(
        severity,
        f"the loss scaler (GradScaler) skipped {skipped} of {steps_words} optimizer "
        f"steps{where} for inf/nan gradients{since}{scale}: {then}{shared}",
        (Figure("skipped", skipped, "steps"), Figure("optimizer_steps", taken, "steps"),
         Figure("total_skipped", last.total_skipped, "steps"),
         Figure("total_steps", last.total_steps, "steps"), Figure("scale", now),
         Figure("first_scale", last.first_scale),
         *((Figure("rank_count", len(ranks)),) if ranks is not None else ())),
        ADVICE if severity != INFO else "", "skipped optimizer steps",
        details={"ranks": ranks} if ranks is not None else {}, code=SKIPPED_STEPS)


def scaler_words(s: ScalerStep) -> str:
    """What the scaler did, in one line: for a view that shows it with no skip too."""
    scale = ""
    now = scale_now(s)
    if now is not None:
        scale = (f", scale {scale_words(s.first_scale)} -> {scale_words(now)}"
                 if s.first_scale is not None and s.first_scale != now
                 else f", scale {scale_words(now)}")
    skipped = f"{s.total_skipped} skipped" if s.total_skipped else "none skipped"
    return (f"GradScaler: {s.total_steps:,} optimizer step{'s' if s.total_steps != 1 else ''}, "
            f"{skipped}{scale} (read from the scaler after each step)")
