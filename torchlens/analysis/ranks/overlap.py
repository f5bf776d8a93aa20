"""Each rank's communication overlapped by compute over its profiled steps,
per collective: what the live rank view shows of FSDP's prefetch all_gathers.

A profiled-step summary carries its step's figures (``summary._overlap``,
``analysis.trace.comm_overlap``'s definitions: GPU kernels only). Here they are
added up over a rank's profiled steps, and the exposed time (communication
not overlapped) is given as a share of those steps' time (``step_ms``).
"""

from __future__ import annotations

from typing import Any

from torchlens.analysis.trace.comm_overlap import COLLECTIVES

Summaries = list[list[Any]]


def profiled_overlap(summaries: Summaries) -> list[dict[str, Any]]:
    """One row per rank: ``profiled`` (its summaries that carry the figure),
    ``gpu`` (None before any such summary; False when none of those steps ran
    a GPU kernel, so overlap cannot be measured), and ``collectives``: per
    collective it ran (``COLLECTIVES`` order), ``communication_us``,
    ``overlapped_us``, ``exposed_us``, ``overlap_pct`` and ``exposed_pct``
    (of the profiled steps' time)."""
    out = []
    for r, sums in enumerate(summaries):
        got = [s for s in sums or [] if isinstance(s.get("overlap"), dict)]
        gpu = any(s["overlap"].get("gpu") for s in got) if got else None
        step_us = sum((s.get("step_ms") or 0.0) * 1000 for s in got)
        totals: dict[str, list[float]] = {}
        for s in got:
            for name, c in (s["overlap"].get("collectives") or {}).items():
                if name in COLLECTIVES and isinstance(c, dict):
                    t = totals.setdefault(name, [0.0, 0.0])
                    t[0] += _number(c.get("communication_us"))
                    t[1] += _number(c.get("overlapped_us"))
        collectives = {}
        for name in COLLECTIVES:
            if name not in totals:
                continue
            comm, over = totals[name]
            collectives[name] = {"communication_us": comm, "overlapped_us": over,
                                 "exposed_us": comm - over,
                                 "overlap_pct": 100.0 * over / comm if comm else None,
                                 "exposed_pct": 100.0 * (comm - over) / step_us if step_us
                                 else None}
        out.append({"rank": r, "profiled": len(got), "gpu": gpu, "collectives": collectives})
    return out


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
