"""Who arrived last at each collective of one profiled step (``%ddp_check --profile``).

A collective completes only when every rank has entered it, so the rank that
enters last holds the others up: its ``t0`` is the latest for that ``seq``.
The summaries of one step (one per rank, docs/RANK_PROFILE.md) are matched by
``seq``, the collective's index within the step, which is the same on every
rank when the ranks issue the same collectives. Plain dicts, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
        last = max(range(len(ranks)), key=lambda i: (t0[i], ranks[i]))
        rows.append({
            "seq": seq, "name": str(arrived[ranks[last]].get("name", "")), "ranks": ranks,
            "t0": t0, "lanes": [int(arrived[r].get("lane") or 0) for r in ranks],
            "last_rank": ranks[last], "last_t0": t0[last],
            "spread_ms": (t0[last] - min(t0)) * 1e3})
    return rows
