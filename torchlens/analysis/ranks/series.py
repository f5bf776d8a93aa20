"""Every step of every rank over wall-clock time, from a ``torchlens run`` folder.

The traces hold only the profiled steps; the collector kept every step record
(``rank<r>/steps.jsonl``, all starts of the rank). ``step_series`` turns them
into what the report's chart draws: per rank, each step's end (s since the
collector started) and its time in ms, which start of the rank it belongs to
(``restart``: 0 before the first restart by the elastic agent), and the
restarts themselves (when the old workers stopped, when the new ones stepped
again, and a label).

A step in which the loss scaler skipped the optimizer step, or ``torch.compile``
recompiled, is also a marked step (the rank's ``marked`` columns, ``MARKS``
its words), kept whether or not the binning kept the step: up to
``MAX_MARKS`` a rank (the first ones; the rest counted in
``marks_left_off``).

Why it is bounded: a long run of many ranks has millions of steps. Each rank
gets an equal share of ``MAX_POINTS`` (at least ``MIN_PER_RANK``); a rank
with more steps is cut into time bins per start and each bin keeps its
slowest step, so the spikes a user looks for survive.

A span a framework labelled (``StepRecord.label``: the Hugging Face
Trainer's ``evaluation`` and ``checkpoint``) is no training step: it goes
to the rank's ``labelled`` columns (every one kept: a run has few), not
into the steps, whose line it would spike (an evaluation) or bin away.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchlens.formats.run_folder.records import CollectedSteps
from torchlens.model.payloads import (
    MarkColumns,
    RankSeries,
    RestartMark,
    SpanColumns,
    StepSeries,
)

MAX_POINTS = 60_000
#: marked steps kept per rank (module docstring)
MAX_MARKS = 2_000
#: what a marked step is, as the chart's legend says it
SKIPPED, RECOMPILED = "optimizer step skipped (GradScaler)", "recompiled (torch.compile)"
MARKS = (SKIPPED, RECOMPILED)
MIN_PER_RANK = 300


def _kept(t: np.ndarray, ms: np.ndarray, start: np.ndarray, budget: int) -> np.ndarray:
    """Indices to draw, in time order: all of them, or the slowest step per bin and start."""
    if len(t) <= budget:
        return np.argsort(t, kind="stable")
    span = float(t.max() - t.min()) or 1.0
    bins = np.minimum(((t - t.min()) / span * budget).astype(np.int64), budget - 1)
    key = start.astype(np.int64) * (budget + 1) + bins
    # slowest first, then the first row of each key: that bin's slowest step
    order = np.lexsort((-ms, key))
    first = np.ones(len(order), bool)
    first[1:] = key[order][1:] != key[order][:-1]
    kept = order[first]
    return kept[np.argsort(t[kept], kind="stable")]


def step_series(collected: CollectedSteps) -> StepSeries:
    """The chart's data (kept in the saved report)."""
    firsts = [min(c["t0"]) for c in collected.ranks.values() if c["t0"]]
    zero = collected.started if collected.started is not None else min(firsts, default=0.0)
    budget = max(MIN_PER_RANK, MAX_POINTS // max(1, len(collected.ranks)))
    ranks: dict[str, RankSeries] = {}
    total = drawn = spans = n_marked = left_off = 0
    for rank, cols in sorted(collected.ranks.items()):
        t0, t1 = np.asarray(cols["t0"], float), np.asarray(cols["t1"], float)
        start = np.asarray(cols["restart"], np.int64)
        ms = (t1 - t0) * 1e3
        labels = cols.get("label") or [None] * len(t1)
        marked = np.asarray([lab is not None for lab in labels], bool)
        train = np.flatnonzero(~marked)
        keep = train[_kept(t1[train], ms[train], start[train], budget)]
        other = np.flatnonzero(marked)
        total += len(t1)
        drawn += len(keep) + len(other)
        spans += len(other)
        skipped = cols.get("skipped") or [0] * len(t1)
        recompiled = cols.get("recompiled") or [False] * len(t1)
        hits = [(i, SKIPPED if skipped[i] else RECOMPILED) for i in train
                if skipped[i] or recompiled[i]]
        n_marked += min(len(hits), MAX_MARKS)
        left_off += max(0, len(hits) - MAX_MARKS)
        hits = hits[:MAX_MARKS]
        at = np.asarray([i for i, _ in hits], np.int64)
        ranks[str(rank)] = RankSeries(
            **_columns(keep, t1, ms, start, cols["step"], zero),
            labelled=SpanColumns(**_columns(other, t1, ms, start, cols["step"], zero),
                                 label=[labels[i] for i in other]),
            marked=MarkColumns(**_columns(at, t1, ms, start, cols["step"], zero),
                               mark=[m for _, m in hits]))
    restarts = []
    for r in collected.restarts:
        t, resumed = r.t, r.resumed_t
        restarts.append(RestartMark(number=r.number, label=r.label or f"restart {r.number}",
                                    words=r.words,
                                    t=None if t is None else t - zero,
                                    resumed=None if resumed is None else resumed - zero))
    # the time zero in words, for the chart's axis: a folder whose manifest is
    # damaged has no collector start (records.steps_without_manifest)
    since = "torchlens run started" if collected.started is not None else "the first step began"
    return StepSeries(zero=zero, since=since, ranks=ranks, restarts=restarts, steps=total,
                      drawn=drawn, labelled=spans, marked=n_marked, marks_left_off=left_off)


def _columns(idx: np.ndarray, t1: np.ndarray, ms: np.ndarray, start: np.ndarray,
             steps: list[Any], zero: float) -> dict[str, list[Any]]:
    return {"t": np.round(t1[idx] - zero, 6).tolist(), "ms": np.round(ms[idx], 4).tolist(),
            "step": [steps[i] for i in idx], "restart": start[idx].tolist()}
