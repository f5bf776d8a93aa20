"""Each rank's communication overlapped by compute over its profiled steps,
per collective: what the live rank view shows of FSDP's prefetch all_gathers.

A profiled-step summary carries its step's figures (``summary._overlap``,
``analysis.trace.comm_overlap``'s definitions: GPU kernels only). Here they are
added up over a rank's profiled steps, and the exposed time (communication
not overlapped) is given as a share of those steps' time (``step_ms``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torchlens.analysis.trace.comm_overlap import COLLECTIVES
from torchlens.model.records import StepOverlap, StepSummary

Summaries = list[list[StepSummary]]


@dataclass(frozen=True)
class OverlapShare:
    """One collective of a rank over its profiled steps: ``communication_us``,
    ``overlapped_us``, ``exposed_us``, ``overlap_pct`` and ``exposed_pct`` (of
    the profiled steps' time; None without a time to divide by)."""

    communication_us: float
    overlapped_us: float
    exposed_us: float
    overlap_pct: float | None
    exposed_pct: float | None


@dataclass(frozen=True)
class RankOverlap:
    """One rank: ``profiled`` (its summaries that carry the figure), ``gpu``
    (None before any such summary; False when none of those steps ran a GPU
    kernel, so overlap cannot be measured), and per collective it ran
    (``COLLECTIVES`` order) its ``OverlapShare``."""

    rank: int
    profiled: int
    gpu: bool | None
    collectives: dict[str, OverlapShare] = field(default_factory=dict)


def profiled_overlap(summaries: Summaries) -> list[RankOverlap]:
    """One row per rank (``RankOverlap``)."""
    out = []
    for r, sums in enumerate(summaries):
        got = [(s, s.overlap) for s in sums or [] if isinstance(s.overlap, StepOverlap)]
        gpu = any(o.gpu for _, o in got) if got else None
        step_us = sum((s.step_ms or 0.0) * 1000 for s, _ in got)
        totals: dict[str, list[float]] = {}
        for _, o in got:
            for name, c in (o.collectives or {}).items():
                if name in COLLECTIVES:
                    t = totals.setdefault(name, [0.0, 0.0])
                    t[0] += c.communication_us or 0.0
                    t[1] += c.overlapped_us or 0.0
        collectives = {}
        for name in COLLECTIVES:
            if name not in totals:
                continue
            comm, over = totals[name]
            collectives[name] = OverlapShare(
                communication_us=comm, overlapped_us=over, exposed_us=comm - over,
                overlap_pct=100.0 * over / comm if comm else None,
                exposed_pct=100.0 * (comm - over) / step_us if step_us else None)
        out.append(RankOverlap(r, len(got), gpu, collectives))
    return out
