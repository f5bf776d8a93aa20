"""The CPU stand-in for allocator history: profiler ``[memory]`` events plus stacks.

On a machine without CUDA, ``torch.profiler.profile(profile_memory=True)``
records every CPU allocation and free (``[memory]`` instant events with
``Addr`` and ``Bytes``, negative on free). They are turned here into a device
trace in torch's snapshot format (``alloc`` / ``free_completed`` entries with
``addr``, ``size``, ``time_us``, ``frames``), so one analysis path serves both.

Why stacks come from a function mode and not from ``with_stack=True``: the
profiler's ``python_function`` events name each function with the line it was
*entered* at, so every allocation in a cell's loop body would point at the
same line. ``SiteRecorder`` (a ``TorchFunctionMode``) captures, per Python-
level torch call, a ``CapturedTraceback`` (the C++ stack walker torch's own
memory history uses, about 3.5 us) with exact current lines, and the call's
start/end wall clock. A function mode, not a dispatch mode: it is entered once
per torch call made from Python (``F.linear``, ``loss.backward()``), not once
per aten op (benchmarks/bench_gpumem.py: 1.8x on its training step with a
dispatch mode, 1.35-1.45x with this one). The user line is the same either
way: what C++ runs inside a call (all of backward, say) has no Python frame,
so its allocations belong to the line that made the call. (Caching one
traceback per call path was tried: walking Python frames to build the key
costs more than the C++ walker it saves.)
An allocation event lies inside the op that made it; the profiler's timestamps
are wall-clock microseconds since ``baseTimeNanoseconds``, so both sides are
put on the same unix-microsecond axis.
"""

from __future__ import annotations

import bisect
import time
from typing import Any

from torch.overrides import TorchFunctionMode
from torch.utils._traceback import CapturedTraceback


class SiteRecorder(TorchFunctionMode):
    """Records ``(start_ns, end_ns, traceback)`` for every torch call from Python."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.tbs: list[Any] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        t0 = time.time_ns()
        tb = CapturedTraceback.extract(script=False, cpp=False)
        out = func(*args, **(kwargs or {}))
        self.starts.append(t0)
        self.ends.append(time.time_ns())
        self.tbs.append(tb)
        return out


def _symbolize(tbs: list[Any], depth: int) -> list[list[dict[str, Any]]]:
    """Frames innermost first, as torch writes them in snapshots."""
    from torch._C._profiler import symbolize_tracebacks

    out = []
    for frames in symbolize_tracebacks([tb.tb for tb in tbs]):
        kept = [f for f in frames if "torch/utils/_traceback.py" not in f["filename"]
                and not f["filename"].endswith("capture/cpu_memory.py")]
        out.append(kept[:depth])
    return out


def device_trace_from_events(
    memory_events: list[dict[str, Any]],
    base_ns: int,
    recorder: SiteRecorder | None,
    depth: int,
) -> list[dict[str, Any]]:
    """Profiler ``[memory]`` events (CPU ones) -> torch-format trace entries.

    ``memory_events`` are the raw Kineto events (``ts`` in us since
    ``base_ns``). Each allocation gets the frames of the op whose
    [start, end] holds it; allocations outside any op get no frames.
    """
    events = sorted(
        (e for e in memory_events if int(e["args"].get("Device Type", 0)) == 0),
        key=lambda e: e["ts"],
    )
    starts = recorder.starts if recorder is not None else []
    ends = recorder.ends if recorder is not None else []
    wanted: dict[int, int] = {}
    trace: list[dict[str, Any]] = []
    for e in events:
        a = e["args"]
        nbytes = int(a.get("Bytes", 0))
        t_ns = base_ns + int(e["ts"] * 1000)
        entry = {
            "action": "alloc" if nbytes > 0 else "free_completed",
            "addr": int(a.get("Addr", 0)),
            "size": abs(nbytes),
            "stream": 0,
            "time_us": t_ns // 1000,
            "frames": [],
        }
        if nbytes > 0 and depth > 0 and starts:
            i = bisect.bisect_right(starts, t_ns) - 1
            if i >= 0 and t_ns <= ends[i]:
                entry["_op"] = wanted.setdefault(i, len(wanted))
        trace.append(entry)
    if wanted and recorder is not None:
        order = sorted(wanted, key=wanted.get)  # type: ignore[arg-type]
        frames = _symbolize([recorder.tbs[i] for i in order], depth)
        for entry in trace:
            k = entry.pop("_op", None)
            if k is not None:
                entry["frames"] = frames[k]
    return trace
