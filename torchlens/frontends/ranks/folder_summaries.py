"""Profiled-step summaries of a run folder that keeps traces but no summaries.

Why: a ``%ddp_check --profile`` folder holds each rank's step records and
its profiled steps' Kineto traces; the summaries its view drew came over the
kernel's store and are not written (``torchlens run`` writes
``summaries.jsonl``). ``torchlens.watch`` of such a folder summarises the
traces again, with the summariser the ranks ran, so it draws what the
``%ddp_check`` view drew: the allocator model's memory, the profiled-step
timeline and the %%torchprof roles.
"""

from __future__ import annotations

import os
import re
from typing import Any

#: traces summarised per rank, its latest: the view keeps about as many
#: summaries, and each trace costs tens of milliseconds to read
MAX_PER_RANK = 64
_STEP = re.compile(r"step(\d+)\.pt\.trace\.json$")


def summaries_from_traces(run_dir: str, rank: int, traces: list[str]
                          ) -> tuple[list[dict[str, Any]], list[str]]:
    """(the summaries of ``rank``'s latest traces, a line per trace not read)."""
    from torchlens.frontends.ranks.rank_side import summarize_file
    from torchlens.model.errors import InputError

    out, problems = [], []
    for rel in traces[-MAX_PER_RANK:]:
        match = _STEP.search(os.path.basename(rel))
        if match is None:
            problems.append(f"{rel}: not named step<N>.pt.trace.json, so its step is unknown")
            continue
        try:
            out.append(summarize_file(os.path.join(run_dir, rel), rank=rank,
                                      step=int(match.group(1)), trace_rel=rel))
        except (OSError, ValueError, InputError) as exc:  # a damaged trace: the others are drawn
            problems.append(f"{rel}: unreadable ({exc})")
    return out, problems


def fill_from_traces(run_dir: str, manifest: Any, summaries: list[list[Any]]) -> list[str]:
    """Summaries for each rank that has none but traces, in place; a line per
    trace not read."""
    unread: list[str] = []
    for r, kept in enumerate(summaries):
        entry = manifest.rank(r)
        if not kept and entry is not None and entry.traces:
            summaries[r], problems = summaries_from_traces(run_dir, r, entry.traces)
            unread += problems
    return unread
