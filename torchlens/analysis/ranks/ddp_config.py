"""How a DDP job synchronises its gradients, judged from what every step did:
gradient accumulation that all-reduces every micro-batch, and buckets too
small for the model.

Pure functions over the step records of docs/RANK_PROFILE.md (``steps[r]``:
one list per rank), on the live window and on a run folder. The figures come
from the ranks' DDP modules (``capture.ranks.phases``: ``StepRecord.ddp``),
so a job without DDP, or records from before they were taken, give nothing.

Neither problem makes one rank slower than the others, so the slow-rank rule
cannot see them: every rank pays alike, and only how often and in how many
pieces the gradients travel says why the steps are long.

- **Accumulation without ``no_sync()``** (code ``accumulation_sync``): a
  rank's *syncs* in a step is the number of forwards of one DDP module, with
  grad on and outside ``no_sync()``, each of which all-reduces every gradient
  in its backward. Accumulating N micro-batches without ``no_sync()`` makes it
  N; with it, 1. Flagged when every DDP rank's median over its last ``WINDOW``
  (20) training steps is ``MIN_SYNCS`` (2) or more: 2 means the step moves its
  gradients twice where once would do. Two models stepped together (a GAN)
  count once each: the most of any one module is what counts.
- **Small buckets** (code ``small_buckets``): DDP all-reduces its gradients
  in buckets of at most ``bucket_cap_mb`` (25 MB by default); each all-reduce
  pays a fixed latency, so many small ones cost more than a few large ones.
  Flagged when the cap is under ``SMALL_CAP`` (1 MiB: a cap someone set, 25x
  under the default) and cuts the gradients into more buckets than the
  default cap would: a small model that fits one bucket either way is not
  flagged. The zoo's job (``bucket_cap_mb=0.001``, 394 KiB of gradients)
  makes 3 buckets where the default makes 1.
- **Parameters that drift apart** (code ``parameter_sync``, a failure: the
  replicas no longer train one model): every ``PARAM_EVERY`` (25) steps each
  rank sums its DDP module's parameters (float64) at the step's end; ranks
  that hold equal parameters give equal sums. When the sums at the newest
  such step differ, the finding names the ranks whose parameters changed
  between that optimizer step and their next forward (each rank checks that
  itself), else the ranks outside the majority, else every rank. Parameters
  changed alike on every rank (a clamp after the step) are no finding.
"""

from __future__ import annotations

import math
from collections import Counter
from statistics import median

from torchlens.model.findings import (
    ACCUMULATION_SYNC,
    FAILED,
    PARAMETER_SYNC,
    SMALL_BUCKETS,
    WARNING,
    Figure,
    Finding,
)
from torchlens.model.records import DdpStep, StepRecord
from torchlens.model.units import format_bytes

WINDOW = 20
MIN_STEPS = 5
MIN_SYNCS = 2
SMALL_CAP = 1 << 20
#: DDP's default ``bucket_cap_mb``, in bytes
DEFAULT_CAP = 25 << 20


def _ddp(rec: StepRecord) -> DdpStep | None:
    return rec.ddp if isinstance(rec.ddp, DdpStep) else None


def accumulation_sync(steps: list[list[StepRecord]], window: int = WINDOW) -> Finding | None:
    """Gradient accumulation that all-reduces every micro-batch (module docstring)."""
    per_rank: dict[int, float] = {}
    for r, recs in enumerate(steps):
        syncs = [d.syncs for rec in recs or [] if not rec.labelled
                 and (d := _ddp(rec)) is not None][-window:]
        if len(syncs) >= MIN_STEPS:
            per_rank[r] = median(syncs)
    if not per_rank or min(per_rank.values()) < MIN_SYNCS:
        return None
    ranks = sorted(per_rank)
    n = min(per_rank.values())
    times = f"{n:g}" if n == max(per_rank.values()) else f"{n:g}-{max(per_rank.values()):g}"
    return Finding(
        WARNING,
        f"gradients are all-reduced {times} times per optimizer step on every rank: each "
        f"step ran {times} forwards of its DDP model outside no_sync(), and each one's "
        f"backward all-reduces every gradient ({times}x the communication accumulation "
        "needs; median over the last steps)",
        (Figure("syncs_per_step", n), Figure("ranks_syncing", len(ranks))),
        "wrap the forward and backward of every micro-batch but the last in "
        "`with model.no_sync():` so the gradients travel once per optimizer step",
        details={"ranks": ranks}, code=ACCUMULATION_SYNC)


def small_buckets(steps: list[list[StepRecord]]) -> Finding | None:
    """DDP buckets far smaller than the default (module docstring), from the
    newest bucket layout any rank recorded."""
    layout: DdpStep | None = None
    ranks = []
    for r, recs in enumerate(steps):
        mine = next((d for rec in reversed(recs or []) if (d := _ddp(rec)) is not None
                     and d.buckets), None)
        if mine is not None:
            ranks.append(r)
            layout = layout or mine
    if (layout is None or layout.bucket_cap_bytes is None or not layout.buckets
            or layout.bucket_bytes is None):
        return None
    cap, count, total = layout.bucket_cap_bytes, layout.buckets, layout.bucket_bytes
    at_default = max(1, math.ceil(total / DEFAULT_CAP))
    if cap >= SMALL_CAP or count <= at_default:
        return None
    return Finding(
        WARNING,
        f"DDP's buckets are small: bucket_cap_mb is {cap / (1 << 20):.3g} MB, so each "
        f"backward all-reduces {count} buckets of {format_bytes(total / count)} "
        f"on average ({format_bytes(total)} of gradients; at the default 25 MB, "
        f"{at_default} bucket{'s' if at_default > 1 else ''}), each all-reduce paying its "
        "fixed latency",
        (Figure("buckets", count), Figure("bucket_cap_bytes", cap, "B"),
         Figure("gradient_bytes", total, "B")),
        "leave bucket_cap_mb at its default (25) or raise it, so the gradients travel in "
        "a few large all-reduces",
        details={"ranks": ranks}, code=SMALL_BUCKETS)


def parameter_sync(steps: list[list[StepRecord]]) -> Finding | None:
    """Ranks whose DDP parameters differ (module docstring), from the newest
    step at which two or more ranks summed them; None when they agree."""
    sums: dict[int, dict[int, float]] = {}  # step -> rank -> sum
    moved: set[int] = set()
    for r, recs in enumerate(steps):
        for rec in recs or []:
            d = _ddp(rec)
            if d is None:
                continue
            if d.param_sum is not None:
                sums.setdefault(rec.step, {})[r] = d.param_sum
            if d.params_moved:
                moved.add(r)
    shared = [s for s, by in sums.items() if len(by) >= 2]
    if not shared:
        return None
    step = max(shared)
    by = sums[step]
    values = Counter(by.values())
    if len(values) == 1:
        return None
    common, n = values.most_common(1)[0]
    minority = sorted(r for r, v in by.items() if v != common) if n > 1 and n > len(by) - n else []
    named = (sorted(moved & set(by)) if moved and moved < set(by) else minority or sorted(by))
    how = (f"{rank_words(named)} changed {'its' if len(named) == 1 else 'their'} parameters "
           "between an optimizer step and the next forward" if named and set(named) <= moved
           else f"{rank_words(named)} hold{'s' if len(named) == 1 else ''} other values")
    spread = ", ".join(f"rank {r} {by[r]:.9g}" for r in sorted(by)[:4])
    return Finding(
        FAILED,
        f"the ranks' parameters differ after step {step}: {how} (parameter sums {spread}); "
        "DDP keeps replicas equal only through the gradients it all-reduces",
        (Figure("step", step), Figure("ranks_differing", len(named))),
        "update parameters only through the optimizer on every rank: no rank-dependent "
        "in-place change of model.module's weights (or broadcast them from rank 0 after it)",
        details={"ranks": named}, code=PARAMETER_SYNC)


def rank_words(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def ddp_config(steps: list[list[StepRecord]]) -> Finding | None:
    """The first of the two findings that applies, or None."""
    return accumulation_sync(steps) or small_buckets(steps)
