"""Why a rank is late: the part of its step breakdown that stands out.

A straggler makes the others wait inside collectives, so its own step time
looks normal; what differs is how its step is made up. Per rank, take the
median over its profiled steps of each role of the ``%%torchprof`` step
breakdown (``analysis.steps``: the TensorBoard plugin's roles); compare it
with the median of the same role over the other ranks. The *likely cause* is
the role with the largest excess (rank - others, µs per step), when

- the excess is at least ``MIN_EXCESS_US`` (0.5 ms) and at least
  ``MIN_EXCESS_SHARE`` (5%) of the median rank's step time, and
- the rank spends at least ``MIN_RATIO`` (1.2x) the others' time in it.

Roles considered: data loading, CPU execution, GPU kernels, memcpy, memset
and CUDA runtime calls. ``comm`` and ``other`` are left out: waiting for the
straggler is exactly what fills them on the other ranks (a gloo collective's
wait counts as ``other``), so they say who waited, not why.
"""

from __future__ import annotations

from statistics import median
from typing import Any

from torchlens.model.units import format_duration

#: role -> words, in the order ties are broken
ROLE_WORDS = {"dataloader": "data loading", "cpu_exec": "CPU work in ops",
              "kernel": "GPU kernel time", "memcpy": "memcpy time", "memset": "memset time",
              "runtime": "CUDA runtime calls"}
MIN_EXCESS_US = 500.0
MIN_EXCESS_SHARE = 0.05
MIN_RATIO = 1.2


def role_medians(step_rows: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per rank: the median over its steps of each role's µs, and of ``dur_us``."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for row in step_rows:
        by_rank.setdefault(int(row["rank"]), []).append(row)
    return {rank: {key: float(median(float(r.get(key) or 0.0) for r in rows))
                   for key in ("dur_us", *(f"{role}_us" for role in ROLE_WORDS))}
            for rank, rows in by_rank.items()}


def likely_cause(rank: int, medians: dict[int, dict[str, float]]) -> dict[str, Any] | None:
    """The role that makes ``rank`` late (module docstring), or ``None``.

    Returns ``role``, ``words``, ``rank_us`` (its median per step),
    ``others_us`` (the median over the other ranks) and ``ratio``
    (``None`` when the others spend no time in it).
    """
    others = [m for r, m in medians.items() if r != rank]
    if rank not in medians or not others:
        return None
    mine = medians[rank]
    step = median(m["dur_us"] for m in medians.values())
    best = None
    for role, words in ROLE_WORDS.items():
        key = f"{role}_us"
        theirs = float(median(m[key] for m in others))
        excess = mine[key] - theirs
        if excess < max(MIN_EXCESS_US, MIN_EXCESS_SHARE * step):
            continue
        if theirs > 0 and mine[key] < MIN_RATIO * theirs:
            continue
        if best is None or excess > best["excess_us"]:
            best = {"role": role, "words": words, "rank_us": mine[key], "others_us": theirs,
                    "excess_us": excess, "ratio": mine[key] / theirs if theirs > 0 else None}
    return best


def cause_phrase(cause: dict[str, Any]) -> str:
    """``its data loading took 42.3 ms per step, 163x the other ranks' median (260.0 µs)``."""
    took = f"its {cause['words']} took {format_duration(cause['rank_us'])} per step"
    if cause["ratio"] is None:
        return f"{took}, where the other ranks' median is 0"
    return (f"{took}, {cause['ratio']:.1f}x the other ranks' median "
            f"({format_duration(cause['others_us'])})")


def with_causes(stragglers: list[dict[str, Any]],
                step_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``straggler_rows`` with ``cause`` (a role or ``None``), ``cause_us``,
    ``cause_others_us`` and ``cause_words`` for every rank that arrived last
    at least once; ``wait_per_step_us``: the wait it caused per profiled step
    of its own (``None`` without steps)."""
    medians = role_medians(step_rows)
    steps: dict[int, int] = {}
    for row in step_rows:
        steps[int(row["rank"])] = steps.get(int(row["rank"]), 0) + 1
    out = []
    for s in stragglers:
        cause = likely_cause(s["rank"], medians) if s.get("last") else None
        n = steps.get(s["rank"])
        out.append(s | {"cause": cause["role"] if cause else None,
                        "cause_us": cause["rank_us"] if cause else None,
                        "cause_others_us": cause["others_us"] if cause else None,
                        "cause_words": cause_phrase(cause) if cause else None,
                        "wait_per_step_us": s["caused_us"] / n if n else None})
    return out
