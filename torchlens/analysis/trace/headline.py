"""The one-line facts shown first under a profiled cell (``render.trace.text``).

Kept as a dataclass of numbers, not text, so the HTML, plain-text and CLI
renderings say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from torchlens.analysis.trace.events import DEVICE_CATEGORIES, category_mask
from torchlens.analysis.trace.ops import op_calls
from torchlens.model import Profile


@dataclass(frozen=True)
class Summary:
    """Headline figures of a profile (times in µs; None where unmeasured)."""

    wall_us: float
    n_events: int
    n_ops: int
    top_op: str | None
    top_op_share: float
    n_kernels: int
    gpu_present: bool
    profiler_overhead_us: float | None
    dropped: dict[str, int] = field(default_factory=dict)


def summarize(profile: Profile) -> Summary:
    """Summarize ``profile``'s main trace (the first); empty figures if none.

    Wall time is the capture's own when recorded, else the trace's span. The
    top op is by self CPU time, the time the op itself spent, which is what a
    user can change.
    """
    trace = profile.trace
    overhead_s = getattr(profile.payload, "profiler_overhead_s", None)
    # a negative figure (older captures with --schedule wrote one) measured nothing
    overhead = None if overhead_s is None or overhead_s < 0 else float(overhead_s) * 1e6
    if trace is None or len(trace.events) == 0:
        wall = (profile.wall_time_s or 0.0) * 1e6
        return Summary(wall, 0, 0, None, 0.0, 0, False, overhead)
    ev = trace.events
    calls = op_calls(trace)
    top, share = None, 0.0
    if len(calls.rows) and calls.self_us.sum() > 0:
        names = ev["name"][calls.rows]
        # sums in row order, as a Python loop would add them
        per_name = np.bincount(names + 1, weights=calls.self_us)  # +1: code -1
        best = np.flatnonzero(per_name == per_name.max())
        if len(best) > 1:  # a tie goes to the name met first
            best = best[np.argsort([np.argmax(names + 1 == b) for b in best])]
        code = int(best[0]) - 1
        top = ev.categories["name"][code]
        share = float(per_name[code + 1]) / float(calls.self_us.sum())
    if profile.wall_time_s is not None:
        wall = profile.wall_time_s * 1e6
    else:
        wall = float((ev["ts"] + ev["dur"]).max() - ev["ts"].min())
    return Summary(
        wall_us=wall,
        n_events=len(ev),
        n_ops=len(calls.rows),
        top_op=top,
        top_op_share=share,
        n_kernels=int(category_mask(trace, "kernel").sum()),
        gpu_present=bool(category_mask(trace, *DEVICE_CATEGORIES).any()),
        profiler_overhead_us=overhead,
        dropped={k: int(v) for k, v in trace.meta.get("dropped", {}).items()},
    )
