"""What ``torch.compile`` did while a capture ran: each frame it compiled, why.

Capture (``capture.trace.compiled``) fills these from torch's own compile
records (``torch._dynamo.utils.get_compilation_metrics()``, one per frame
compiled, and dynamo's ``counters``), never from its log text; analysis
(``analysis.trace.compiled``) joins them with the profiler's
``Torch-Compiled Region: F/C`` events. A ``.tlprof`` file keeps them as JSON.
"""

from __future__ import annotations

from collections import Counter

import msgspec

#: compiles kept in what a rank compiled so far (its first: where breaks are met)
SO_FAR_FRAMES = 48


class CompiledFrame(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One compile of one Python frame (torch's ``CompilationMetrics``).

    ``compile_id``: torch's ``"F/C"``, frame F's C-th compile (C > 0 is a
    recompile); the profiler names the code it made ``Torch-Compiled Region:
    F/C``. ``frame``, ``file``, ``line``: the function compiled (a
    ``torch_dynamo_resume_in_...`` frame is the code after a graph break,
    and its ``line`` is the line the break was on). ``recompile_reason``:
    the guard that failed and so made this compile ("tensor 'x' size
    mismatch at index 0. expected 4, actual 8"); ``restart_reasons``: why
    tracing stopped and restarted inside this frame (a graph break's reason
    among them); ``failed``: the compile's error, if it failed.
    """

    compile_id: str
    frame: str
    file: str
    line: int
    started: float | None = None  # unix seconds
    compile_s: float | None = None  # torch's entire_frame_compile_time_s
    graph_ops: int | None = None
    recompile_reason: str | None = None
    restart_reasons: list[str] = msgspec.field(default_factory=list)
    failed: str | None = None


class CompileLog(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What torch compiled during one capture, or in one step of a rank
    (``StepRecord.compiled``: set only on a step that compiled or met a break).

    ``frames``: the compiles, in the order they started; ``graph_breaks``:
    dynamo's count of each graph-break reason during the capture (the counts
    include breaks on frames compiled before it began, if dynamo met them
    again); ``unique_graphs``: graphs made; ``lost``: > 0 when some of the
    capture's compiles may be missing (torch keeps its last 64 records, and
    every one of them was new; how many went, nothing says);
    ``source``: where the figures came from, as a view says it ("" in a
    step record: a rank's records all come from the same place).
    """

    frames: list[CompiledFrame] = msgspec.field(default_factory=list)
    #: compiles made before the capture that torch still keeps, as far as they
    #: name the regions the capture ran (compile id, function, line)
    known: list[CompiledFrame] = msgspec.field(default_factory=list)
    graph_breaks: dict[str, int] = msgspec.field(default_factory=dict)
    unique_graphs: int = 0
    lost: int = 0
    source: str = ""


def merged(total: CompileLog | None, log: CompileLog) -> CompileLog:
    """``total`` with ``log`` added: frames (the first ``SO_FAR_FRAMES``; the rest
    counted in ``lost``), break counts and graphs summed."""
    if total is None:
        total = CompileLog()
    frames = [*total.frames, *log.frames]
    breaks = Counter(total.graph_breaks)
    breaks.update(log.graph_breaks)
    return CompileLog(frames=frames[:SO_FAR_FRAMES], graph_breaks=dict(breaks),
                      unique_graphs=total.unique_graphs + log.unique_graphs,
                      lost=total.lost + log.lost + max(0, len(frames) - SO_FAR_FRAMES))
