"""Which annotation stage (forward, backward, optimizer step, the user's own
``record_function`` names) each allocation was made in.

Torch's allocator history records ``record_function`` ranges (``ProfilerStep#N``,
``Optimizer.step#AdamW.step``, the user's own names) as a snapshot's
``external_annotations``: ``{"stage": "START" | "END", "name", "device", "time_us"}``.
The CPU stand-in writes the profiler's ``user_annotation`` ranges in the same form
(``capture.memory.cpu``). A block's stage is the innermost range open when it was
allocated: of the ranges with start <= t <= end, the one that started last. Times
are whole microseconds on both sides, so an allocation in the microsecond a range
ends and its sibling starts goes to the sibling (the one that started last).

Frames never name a ``record_function`` range (it is not a Python frame), so a
snapshot without ``external_annotations`` has no stages: ``missing_line`` says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: a block allocated while no annotation range was open
NO_STAGE = "(no annotation open)"
#: a block alive before the recorded window (its allocation time is not recorded)
BEFORE = "alive before the window"


@dataclass(frozen=True)
class Stage:
    """One ``record_function`` range: [start, end] in the trace's ``time_us``."""

    name: str
    start: float
    end: float


def _valid(a: Any) -> bool:
    t = a.get("time_us") if isinstance(a, dict) else None
    return (isinstance(a, dict) and isinstance(a.get("name"), str)
            and a.get("stage") in ("START", "END")
            and isinstance(t, (int, float)) and not isinstance(t, bool))


def stage_ranges(annotations: Any, device: int) -> tuple[list[Stage], int]:
    """The ranges of ``external_annotations`` (START/END paired by name, last opened
    first closed), and how many entries were malformed and skipped. A range still
    open at the dump ends at +inf; an END whose START came before recording began
    starts at -inf. Annotations of ``device`` when any name it, else all of them."""
    items = annotations if isinstance(annotations, list) else []
    good = [a for a in items if _valid(a)]
    mine = [a for a in good if a.get("device", device) == device]
    good = mine or good
    open_: dict[str, list[float]] = {}
    out: list[Stage] = []
    for a in sorted(good, key=lambda a: a["time_us"]):  # stable: same-time order kept
        if a["stage"] == "START":
            open_.setdefault(a["name"], []).append(a["time_us"])
        else:
            starts = open_.get(a["name"])
            out.append(Stage(a["name"], starts.pop() if starts else -math.inf, a["time_us"]))
    out += [Stage(n, s, math.inf) for n, starts in open_.items() for s in starts]
    out.sort(key=lambda s: (s.start, -s.end))  # outer before inner at the same start
    return out, len(items) - len([a for a in items if _valid(a)])


def stages_at(times: list[float], ranges: list[Stage]) -> list[str]:
    """The innermost range open at each time (``times`` in any order): one sweep."""
    order = sorted(range(len(times)), key=times.__getitem__)
    out = [NO_STAGE] * len(times)
    active: list[Stage] = []  # by start: the last is the innermost
    k = 0
    for i in order:
        t = times[i]
        while k < len(ranges) and ranges[k].start <= t:
            active.append(ranges[k])
            k += 1
        active = [s for s in active if s.end >= t]
        if active:
            out[i] = active[-1].name
    return out


def missing_line(ranges: list[Stage], skipped: int, timed: bool) -> str | None:
    """Why memory by stage is missing or partial, in one line; None when complete."""
    if not ranges:
        return ("No record_function annotations recorded: memory by stage (forward, "
                "backward, optimizer) is missing; wrap each phase in "
                "torch.profiler.record_function(NAME).")
    if not timed:
        return ("The history has no times (older format): allocations cannot be matched "
                "to the record_function annotations, so memory by stage is missing.")
    if skipped:
        return (f"{skipped:,} of the snapshot's external_annotations were malformed (no "
                "name, START/END stage or time) and skipped: stages may be incomplete.")
    return None
