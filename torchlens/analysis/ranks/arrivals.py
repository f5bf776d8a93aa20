"""Who arrived last at a collective: the one rule, for one profiled step of
``%ddp_check --profile`` (``collective_arrivals``) and for a multi-rank run's
matched collectives (``analysis.runs.collectives``, ``analysis.runs.clock``).

A collective completes only when every rank has entered it, so the rank that
enters last holds the others up: its arrival (``t0``) is the latest; ties go
to the lowest rank. Each rank waited from its own arrival to the last one.
The summaries of one step (one per rank, docs/RANK_PROFILE.md) are matched by
``seq``, the collective's index within the step, which is the same on every
rank when the ranks issue the same collectives. Plain dicts, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def last_arrival(arrivals: Mapping[int, float]) -> dict[str, Any]:
    """``arrivals``: rank -> when it entered the collective (unix s). Returns
    ``last_rank``, ``last_t0``, ``waits_us`` (rank -> µs it waited for the last
    one, 0 for the last), ``max_wait_us`` (last arrival minus first) and
    ``total_wait_us`` (the waits summed)."""
    last_t0 = max(arrivals.values())
    waits = {r: (last_t0 - t) * 1e6 for r, t in arrivals.items()}
    return {"last_rank": min(r for r, t in arrivals.items() if t == last_t0),
            "last_t0": last_t0, "waits_us": waits,
            "max_wait_us": (last_t0 - min(arrivals.values())) * 1e6,
            "total_wait_us": sum(waits.values())}


def collective_arrivals(summaries: Mapping[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per ``seq`` of the step: the arrivals in rank order and the last one.

    ``summaries``: rank -> that rank's summary of the same step. A row holds
    ``seq``, ``name`` (the last arrival's), ``ranks``, ``t0`` (unix s, per
    rank), ``lanes`` (lane index per rank), ``last_rank``, ``last_t0`` and
    ``spread_ms`` (last arrival minus first; 0 when one rank has it). Rows
    come in ``seq`` order.
    """
    by_seq: dict[int, dict[int, dict[str, Any]]] = {}
    for rank, summary in summaries.items():
        for coll in summary.get("collectives") or []:
            seq = coll.get("seq")
            if seq is None or coll.get("t0") is None:
                continue
            # the first of a seq on one rank: a repeat would be a malformed summary
            by_seq.setdefault(int(seq), {}).setdefault(int(rank), coll)
    rows = []
    for seq in sorted(by_seq):
        arrived = by_seq[seq]
        ranks = sorted(arrived)
        t0 = [float(arrived[r]["t0"]) for r in ranks]
        last = last_arrival(dict(zip(ranks, t0, strict=True)))
        rows.append({
            "seq": seq, "name": str(arrived[last["last_rank"]].get("name", "")), "ranks": ranks,
            "t0": t0, "lanes": [int(arrived[r].get("lane") or 0) for r in ranks],
            "last_rank": last["last_rank"], "last_t0": last["last_t0"],
            "spread_ms": last["max_wait_us"] / 1e3})
    return rows
