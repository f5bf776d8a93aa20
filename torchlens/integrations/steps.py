"""Step ends and labelled spans told by a framework's callback, passed to the
capture that ``torchlens.step()`` reaches (no framework imported here).

Under ``torchlens run`` (and ``%ddp_check --profile``) that capture is the
rank's ``RankProfiler``: ``end_step`` ends a training step and says which
framework found it (``steps_by``); ``end_span`` ends a span that was no
training step (an evaluation, a checkpoint save) under its label, which the
slow-rank verdict leaves out. Inside ``%%torchprof`` (a capture without
labels) a training step's end is its ``step()``, and a labelled span is left
in the step that follows.

A job that calls ``torchlens.step()`` itself keeps its own steps: from its
first call the callback ends nothing (its calls and the callback's would each
end the same step).
"""

from __future__ import annotations

import os
from typing import Any

from torchlens.capture.ranks.autostep import EXPLICIT
from torchlens.capture.ranks.stepper import RankProfiler
from torchlens.capture.trace import profiler


def attach_if_run() -> None:
    """Under ``torchlens run`` attach this rank now, as a first ``torchlens.step()``
    does (a launcher whose ranks did not attach when they started)."""
    if os.environ.get("TORCHLENS_COLLECTOR"):
        from torchlens.frontends.ranks.rank_side import attach

        attach()


def _capture() -> Any:
    capture = profiler.innermost()
    if isinstance(capture, RankProfiler) and capture.steps_by == EXPLICIT:
        return None  # the job's own torchlens.step() calls end its steps
    return capture


def end_step(by: str) -> None:
    """A training step ended (the framework's optimizer step is done)."""
    capture = _capture()
    if isinstance(capture, RankProfiler):
        capture.step(by=by)
    elif capture is not None:
        capture.step()


def end_span(label: str, by: str) -> None:
    """A span that was no training step ended: recorded under ``label``."""
    capture = _capture()
    if isinstance(capture, RankProfiler):
        capture.step(by=by, label=label)


def end_span_at_next_phase(label: str, by: str) -> None:
    """A span that is no training step starts now and ends where the job next
    enters a phase (its next batch, forward, ...) or at ``end_pending``: a
    save told before it writes (Lightning's ``on_save_checkpoint``)."""
    capture = _capture()
    if isinstance(capture, RankProfiler):
        capture.label_next = (label, by)


def end_pending() -> None:
    """End the span ``end_span_at_next_phase`` began, if no phase has (the job's end)."""
    capture = _capture()
    if isinstance(capture, RankProfiler) and capture.label_next is not None:
        (label, by), capture.label_next = capture.label_next, None
        capture.step(by=by, label=label)
