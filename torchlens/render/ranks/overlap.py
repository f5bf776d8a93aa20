"""The rank view's words on communication overlapped by compute: the figures of
``analysis.ranks.overlap.profiled_overlap`` for the ranks drawn, or why there
are none (overlap is timed from GPU kernels: a CPU run has none)."""

from __future__ import annotations

from torchlens.analysis.ranks.overlap import RankOverlap
from torchlens.model.units import format_percent, format_us_as_ms

#: what the view says when the profiled steps ran no GPU kernel
NO_GPU = ("Communication overlapped by compute: measured from GPU kernels only; not "
          "available for this run (its profiled steps ran no GPU kernels, e.g. a CPU run "
          "on gloo).")


def overlap_caption(rows: list[RankOverlap], shown: list[int]) -> str:
    """One paragraph: per rank drawn, each collective's share overlapped by
    compute and its exposed time (of the profiled steps); "" before any
    profiled step said."""
    by_rank = {row.rank: row for row in rows}
    mine = [by_rank[r] for r in shown if r in by_rank and by_rank[r].gpu is not None]
    if not mine:
        return ""
    if not any(row.gpu for row in mine):
        return NO_GPU
    parts = []
    for row in mine:
        if not row.gpu:
            parts.append(f"rank {row.rank}: no GPU kernels")
        elif not row.collectives:
            parts.append(f"rank {row.rank}: no communication kernels")
        else:
            parts.append(f"rank {row.rank}: " + "; ".join(
                f"{name} {format_percent(c.overlap_pct)} overlapped, "
                f"{format_us_as_ms(c.exposed_us)} exposed"
                + (f" ({format_percent(c.exposed_pct)} of the steps)"
                   if c.exposed_pct is not None else "")
                for name, c in row.collectives.items()))
    gathers = any("all_gather" in row.collectives for row in mine if row.gpu)
    why = (" Exposed all_gather (FSDP): parameter prefetch that compute did not hide."
           if gathers else "")
    return ("Communication overlapped by compute, GPU kernels of the profiled steps: "
            + " · ".join(parts) + "." + why)
