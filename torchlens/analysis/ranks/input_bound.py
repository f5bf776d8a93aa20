"""An input-bound job: every rank spends most of its step waiting for its next
batch, so the job runs at the speed of its input pipeline, not of its model.

Pure functions over the step records of docs/RANK_PROFILE.md (``steps[r]``:
one list per rank), on the live window and on a run folder.

Why a rule of its own: the slow-rank rule compares ranks, and when every rank
starves alike none is late (the others wait for nobody); the step time is
long on all of them and only the share of it in ``data`` (the DataLoader's
``__next__``, ``capture.ranks.phases``) says why.

Definitions (times in ms, a missing or null phase as 0):

- A rank's *data share*: the median of its ``data`` over the median of its
  step, over its last ``WINDOW`` (20, the slow-rank verdict's window)
  training steps (a labelled span, an evaluation or checkpoint, is no step).
- The job is input-bound when every rank with at least ``MIN_STEPS`` (5)
  such steps has a data share of at least ``INPUT_SHARE`` (50%) and a median
  ``data`` of at least ``MIN_DATA_MS`` (1 ms), and at least two ranks do.
  Half, because then the input pipeline, not the model, sets the pace: more
  DataLoader workers hide the loading behind compute and the step could
  shrink by up to that share. Measured on the zoo (2 CPU ranks on a loaded
  2-core machine): the starved job (0.5 ms a sample, 32 a batch, no workers)
  62-77% on every rank; its twin with two workers at most 43% on a rank and
  33% on its lower rank, every other healthy job under 10%; a rank whose own
  data is slow (the data straggler) 73-84% while its peer has ~0%, which is
  the slow-rank rule's, not this one's (every rank must starve).
- 1 ms: a data share of tiny steps (a few ms of a toy model) is no input
  pipeline worth changing.

The finding (code ``input_bound``) names every rank, the shares' range and
the median wait, with advice for the DataLoader.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from torchlens.model.findings import INPUT_BOUND, WARNING, Figure, Finding
from torchlens.model.records import StepRecord
from torchlens.model.units import format_ms

WINDOW = 20
MIN_STEPS = 5
INPUT_SHARE = 0.5
MIN_DATA_MS = 1.0


@dataclass(frozen=True)
class RankInput:
    """One rank's median data wait and step over the window, in ms."""

    rank: int
    data_ms: float
    step_ms: float
    steps: int

    @property
    def share(self) -> float:
        return self.data_ms / self.step_ms if self.step_ms > 0 else 0.0


def rank_inputs(steps: list[list[StepRecord]], window: int = WINDOW) -> list[RankInput]:
    """Each rank's data wait over its last ``window`` training steps (ranks
    with fewer than ``MIN_STEPS`` left out)."""
    out = []
    for r, recs in enumerate(steps):
        training = [rec for rec in recs or [] if not rec.labelled][-window:]
        if len(training) < MIN_STEPS:
            continue
        data = median(1e3 * (rec.phases.get("data") or 0.0) for rec in training)
        step = median(1e3 * (rec.t1 - rec.t0) for rec in training)
        out.append(RankInput(r, data, step, len(training)))
    return out


def input_bound(steps: list[list[StepRecord]], window: int = WINDOW) -> Finding | None:
    """The input-bound finding (module docstring), or None."""
    ranks = rank_inputs(steps, window)
    if len(ranks) < 2 or not all(x.share >= INPUT_SHARE and x.data_ms >= MIN_DATA_MS
                                 for x in ranks):
        return None
    low, high = min(x.share for x in ranks), max(x.share for x in ranks)
    data = median(x.data_ms for x in ranks)
    step = median(x.step_ms for x in ranks)
    shares = f"{low:.0%}" if round(low, 2) == round(high, 2) else f"{low:.0%}-{high:.0%}"
    sentence = (f"the job is input-bound: every rank waits for its next batch {shares} of its "
                f"step (median {format_ms(data)} of {format_ms(step)}, over its last "
                f"{min(x.steps for x in ranks)} steps)")
    return Finding(WARNING, sentence,
                   (Figure("ranks_input_bound", len(ranks)), Figure("data_share_min", low, "x"),
                    Figure("data_share_max", high, "x"), Figure("data_ms", data, "ms"),
                    Figure("median_step_ms", step, "ms")),
                   "give the DataLoader workers (num_workers > 0, pin_memory=True on a GPU) "
                   "so batches load while the model computes, or make each sample cheaper "
                   "to load (preprocess once, faster storage)",
                   details={"ranks": [x.rank for x in ranks]}, code=INPUT_BOUND)
