"""The only code that reads ``torch.compile``'s own records (``torch._dynamo``).

``CompileWatch`` notes where dynamo's records stand when a capture starts and
returns what was added when it ends, as a ``model.compiled.CompileLog``:

- ``torch._dynamo.utils.get_compilation_metrics()``: one ``CompilationMetrics``
  per frame compile (torch keeps the last 64), with the compile id, the
  function, its compile time, the guard whose failure made a recompile
  (``recompile_reason``) and why tracing restarted (``restart_reasons``:
  a graph break's reason among them);
- ``torch._dynamo.utils.counters``: ``graph_break`` (reason -> times met),
  ``stats.unique_graphs``.

Nothing here parses log text, and nothing imports dynamo: a process that
never imported ``torch._dynamo`` compiled nothing, and importing it costs
seconds. What torch records for each compile is read as it is; a field a
torch version lacks reads as missing (``getattr`` with a default).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable
from typing import Any

from torchlens.model.compiled import CompiledFrame, CompileLog, merged

SOURCE = ("torch._dynamo's compile records (get_compilation_metrics) and counters "
          "(graph_break, unique_graphs)")


def _dynamo_utils() -> Any:
    """``torch._dynamo.utils`` if something already imported it, else None."""
    return sys.modules.get("torch._dynamo.utils")


class CompileWatch:
    """``start()`` when a capture begins, ``finish()`` when it ends."""

    def __init__(self, named: bool = True) -> None:
        self._seen: set[int] = set()
        self._counts: dict[str, Counter[str]] = {}
        #: whether the log also names the compiles made before ``start()``
        #: (``CompileLog.known``: a cell that runs code compiled in another)
        self._named = named

    def start(self) -> None:
        utils = _dynamo_utils()
        if utils is None:
            return
        try:
            self._seen = {id(m) for m in utils.get_compilation_metrics()}
            self._counts = _counts(utils)
        except Exception:  # noqa: BLE001 - a torch whose records differ: nothing to compare
            self._seen, self._counts = set(), {}

    def finish(self) -> CompileLog | None:
        """What dynamo compiled since ``start()``; None when it compiled nothing
        (or was never imported)."""
        utils = _dynamo_utils()
        if utils is None:
            return None
        try:
            kept = utils.get_compilation_metrics()
            metrics = [m for m in kept if id(m) not in self._seen]
            earlier = [m for m in kept if id(m) in self._seen]
            now = _counts(utils)
        except Exception:  # noqa: BLE001 - the capture keeps what else it has
            return None
        before = self._counts
        delta = {k: now.get(k, Counter()) - before.get(k, Counter()) for k in now}
        frames = [frame_of(m) for m in metrics]
        frames = [f for f in frames if f is not None]
        breaks = dict(delta.get("graph_break", Counter()))
        known = [CompiledFrame(compile_id=f.compile_id, frame=f.frame, file=f.file, line=f.line)
                 for f in map(frame_of, earlier) if f is not None] if self._named else []
        if not frames and not breaks and not known:
            return None
        # torch keeps its last ``maxlen`` records: when every one is new, older
        # ones of this capture may have gone (how many, nothing says)
        kept = getattr(getattr(utils, "_compilation_metrics", None), "maxlen", None)
        return CompileLog(
            frames=sorted(frames, key=lambda f: f.started or 0.0), known=known,
            graph_breaks=breaks,
            unique_graphs=int(delta.get("stats", Counter()).get("unique_graphs", 0)),
            lost=int(kept is not None and len(metrics) >= kept), source=SOURCE)


def _counts(utils: Any) -> dict[str, Counter[str]]:
    counters = utils.counters
    return {k: Counter(dict(counters.get(k, {}))) for k in ("graph_break", "stats", "frames")}


def frame_of(m: Any) -> CompiledFrame | None:
    """One ``CompilationMetrics`` as a ``CompiledFrame`` (None: not a frame's
    compile, e.g. a backward graph's, which has no compile id of its own)."""
    compile_id = getattr(m, "compile_id", None)
    name = getattr(m, "co_name", None)
    if not compile_id or not name or getattr(m, "is_forward", True) is False:
        return None
    restarts = getattr(m, "restart_reasons", None) or ()
    fail_type, fail_reason = getattr(m, "fail_type", None), getattr(m, "fail_reason", None)
    return CompiledFrame(
        compile_id=str(compile_id), frame=str(name),
        file=str(getattr(m, "co_filename", "") or ""),
        line=int(getattr(m, "co_firstlineno", 0) or 0),
        started=_number(getattr(m, "start_time", None)),
        compile_s=_number(getattr(m, "entire_frame_compile_time_s", None)),
        graph_ops=_whole(getattr(m, "graph_op_count", None)),
        recompile_reason=str(m.recompile_reason) if getattr(m, "recompile_reason", None)
        else None,
        restart_reasons=sorted(str(r) for r in restarts),
        failed=f"{fail_type}: {fail_reason}" if fail_type else None)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _whole(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


#: a rank's record carries what it compiled so far once in this many steps, so
#: every window of ``analysis.ranks.stalls.STALL_WINDOW`` (60) steps holds one
SO_FAR_EVERY = 50


class CompileSteps:
    """What dynamo compiled in each step of a rank (``StepRecord.compiled``), and
    once in ``SO_FAR_EVERY`` steps what it compiled since the rank began
    (``StepRecord.compiled_so_far``: the graph breaks met at the first steps
    stay in every window of steps a rule judges).

    ``take()`` at each step's end. Its common case, a step that compiled
    nothing, costs a look at where dynamo's records stand (how many it
    keeps, the newest, the graph breaks counted); only a step that compiled
    reads the records (``CompileWatch``). Fails open: a
    torch whose records differ gives no figure (``errors`` counts them),
    never an error in the step.
    """

    def __init__(self) -> None:
        self._watch = CompileWatch(named=False)
        self._mark: tuple[int, int] | None = None
        self.errors = 0
        self.total: CompileLog | None = None
        self._steps = 0

    def _now(self) -> tuple[int, int, int] | None:
        """Where dynamo's records stand: how many it keeps, its newest, and the
        graph breaks it counted."""
        utils = _dynamo_utils()
        if utils is None:
            return None
        kept = utils.get_compilation_metrics()
        breaks = utils.counters.get("graph_break")
        return (len(kept), id(kept[-1]) if kept else 0, sum(breaks.values()) if breaks else 0)

    def take(self) -> CompileLog | None:
        """What the step that just ended compiled (None: nothing)."""
        self._steps += 1
        try:
            now = self._now()
            if now is None or now == self._mark:
                return None
            if self._mark is None:  # dynamo came in this step: all it did is new
                self._watch = CompileWatch(named=False)
            log = self._watch.finish()
            self._watch.start()
            self._mark = now
            if log is not None:
                self.total = merged(self.total, log)
            return log
        except Exception:  # noqa: BLE001 - torchlens' error: the step goes on without it
            self.errors += 1
            return None

    def so_far(self) -> CompileLog | None:
        """Everything compiled since the rank began, on every ``SO_FAR_EVERY``-th
        step (after ``take``); None on the others, or when nothing compiled."""
        return self.total if self._steps % SO_FAR_EVERY == 0 else None


def never_compiled(alone: Iterable[Any], whole: Iterable[Any]) -> bool:
    """Dynamo compiles none of these functions' frames, once it is imported.

    For torchlens' own code that runs inside a user's compiled call (the timers
    around DDP's forward, their bookkeeping): dynamo would compile each such
    frame it meets, with guards on torchlens' counters that fail every step,
    and list the frames among the user's compiles. ``alone``: the frame is
    run as it is, what it calls (the user's forward it wraps) still compiles;
    ``whole``: nor anything it calls. Uses torch's per-code frame strategy
    (``torch._dynamo.eval_frame.set_code_exec_strategy``, what
    ``skip_code`` calls); False where this torch has none (nothing changed).
    """
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    kinds = sys.modules.get("torch._dynamo.types")
    set_strategy = getattr(eval_frame, "set_code_exec_strategy", None)
    action = getattr(kinds, "FrameAction", None)
    strategy = getattr(kinds, "FrameExecStrategy", None)
    if set_strategy is None or action is None or strategy is None:
        return False
    try:
        for fn in alone:
            set_strategy(fn.__code__, strategy(action.SKIP, action.DEFAULT))
        for fn in whole:
            set_strategy(fn.__code__, strategy(action.SKIP, action.SKIP))
    except Exception:  # noqa: BLE001 - a torch whose API differs: frames compile as before
        return False
    return True
