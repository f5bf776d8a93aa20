"""The CPU stand-in for allocator history: profiler ``[memory]`` events plus stacks.

On a machine without CUDA, the profiler with ``profile_memory`` records every
CPU allocation and free (``[memory]`` instant events with ``Addr`` and
``Bytes``, negative on free). They are turned here into a device trace in
torch's snapshot format (``alloc`` / ``free_completed`` entries with ``addr``,
``size``, ``time_us``, ``frames``), so one analysis path serves both.
``MemoryEvents`` enables it for ``RecordScope.USER_SCOPE`` only: the
allocator reports to the profiler's thread state without any op event, so the
allocations and frees are the same as ``torch.profiler.profile``'s, while
aten ops, with no callback observing them, stay on RecordFunction's fast path
(same ``--micro`` runs, per step: ``torch.profiler.profile`` +194 to +351 us,
this way -35 to +101 us, i.e. within the noise).

Why stacks come from a function mode and not from ``with_stack=True``: the
profiler's ``python_function`` events name each function with the line it was
*entered* at, so every allocation in a cell's loop body would point at the
same line. ``SiteRecorder`` (a ``TorchFunctionMode``) captures, per Python-
level torch call, a traceback from ``torch._C._profiler.gather_traceback`` (the
C++ stack walker torch's own memory history uses) with exact current lines,
and the call's start/end wall clock. A function mode, not a dispatch mode: it
is entered once per torch call made from Python (``F.linear``,
``loss.backward()``), not once per aten op (benchmarks/bench_gpumem.py: 1.8x
on its training step with a dispatch mode). The user line is the same either
way: what C++ runs inside a call (all of backward, say) has no Python frame,
so its allocations belong to the line that made the call. (Caching one
traceback per call path was tried: walking Python frames to build the key
costs more than the C++ walker it saves.)

What a call costs (``benchmarks/bench_gpumem.py --micro``, two runs on a quiet
2-core machine): the mode alone, with an empty ``__torch_function__``, turns a
``p.grad`` read from ~0.1 us into 1.5-1.8 us, ``x.add_(0)`` from ~4 into 6.5-7.4
us and ``F.relu(x)`` (a Python function: ``handle_torch_function``) from 1.6
into 6-7 us; that is the floor of any function mode. On top of it, the
recorder: ``gather_traceback(True, False, False)`` 0.4-0.6 us, where
``CapturedTraceback.extract`` spends 3.1-3.3 us on the same walk (an
``import`` statement, keyword arguments and a wrapper object per call);
``time.time_ns`` 0.1 us (``perf_counter_ns`` is no cheaper). The training step
makes 68 torch calls from Python; 43 cannot allocate (37 reads and writes of
``.grad``, ``.is_sparse``, ``.device``; ``_set_grad_enabled``; the
optimizer's ``record_function``) and go straight through: ``NO_ALLOC``, a
skip-list, so anything not in it is recorded whether or not it returns a
tensor (``backward()`` and in-place optimizer ops allocate and return None).
Per torch call of a 16-wide MLP step (process time, so Python dominates):
empty mode +4.6 to +6.1 us, the recorder as first built (``extract`` and an
interval on every call) +20.5 to +20.8 us, this one +6.9 to +8.2 us.

An allocation event lies inside the op that made it; the profiler's timestamps
are wall-clock microseconds since ``baseTimeNanoseconds``, so both sides are
put on the same unix-microsecond axis.
"""

from __future__ import annotations

import bisect
import json
import time
from typing import Any

import torch
from torch._C._profiler import gather_traceback
from torch.overrides import TorchFunctionMode

from torchlens.model.snapshot import Frame, TraceEntry

# Tensor attributes whose getter returns metadata or an existing object (never
# new storage) and whose setter, if any, only rebinds or frees. The views
# ``T``/``mT``/``H``/``mH``/``real``/``imag`` are left out: a sparse
# ``.T`` builds new indices.
_NO_ALLOC_ATTRS = (
    "_backward_hooks", "_base", "_cdata", "_grad", "_grad_fn",
    "_has_symbolic_sizes_strides", "_post_accumulate_grad_hooks", "_python_dispatch",
    "_version", "data", "device", "dtype", "grad", "grad_dtype", "grad_fn", "is_cpu",
    "is_cuda", "is_ipu", "is_leaf", "is_maia", "is_meta", "is_mkldnn", "is_mps",
    "is_mtia", "is_nested", "is_quantized", "is_sparse", "is_sparse_csr", "is_vulkan",
    "is_xla", "is_xpu", "itemsize", "layout", "name", "nbytes", "ndim", "output_nr",
    "requires_grad", "retains_grad", "shape", "volatile",
)
# Tensor methods that only read metadata.
_NO_ALLOC_METHODS = (
    "dim", "ndimension", "size", "numel", "nelement", "stride", "storage_offset",
    "element_size", "data_ptr", "is_contiguous", "is_floating_point", "is_complex",
    "is_signed", "is_inference", "get_device", "requires_grad_", "retain_grad",
    "__len__",
)


def _no_alloc_funcs() -> frozenset[Any]:
    """The torch calls ``SiteRecorder`` lets through without a stack or interval.

    A skip-list, not an allow-list: a call missing here is merely recorded.
    What may allocate stays recorded even when it returns None
    (``loss.backward()``, in-place and foreach optimizer ops).
    """
    base = torch._C.TensorBase
    funcs: set[Any] = set()
    for name in _NO_ALLOC_ATTRS:
        d = base.__dict__.get(name)
        if d is not None:
            funcs.add(d.__get__)
            if hasattr(d, "__set__"):
                funcs.add(d.__set__)
    for name in _NO_ALLOC_METHODS:
        f = getattr(torch.Tensor, name, None)
        if f is not None:
            funcs.add(f)
    funcs.add(torch._C._set_grad_enabled)
    # The optimizer's record_function scope: a RecordFunction handle, no tensor.
    ops = getattr(torch.ops, "profiler", None)
    for name, overload in (("_record_function_enter_new", None),
                           ("_record_function_enter", None),
                           ("_record_function_exit", "_RecordFunction")):
        try:
            packet = getattr(ops, name)
        except (AttributeError, RuntimeError):
            continue
        funcs.add(packet)
        if overload is not None and hasattr(packet, overload):
            funcs.add(getattr(packet, overload))
        funcs.add(getattr(packet, "default", packet))
    return frozenset(funcs)


NO_ALLOC = _no_alloc_funcs()
_time_ns = time.time_ns


class SiteRecorder(TorchFunctionMode):
    """Records ``(start_ns, end_ns, traceback)`` for every torch call from Python
    that may allocate (all but ``NO_ALLOC``)."""

    def __init__(self) -> None:
        super().__init__()
        self.starts: list[int] = []
        self.ends: list[int] = []
        # raw ``torch._C._profiler`` tracebacks, for ``symbolize_tracebacks``
        self.tbs: list[Any] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        try:
            skip = func in NO_ALLOC
        except TypeError:  # an unhashable callable: record it
            skip = False
        if skip:
            return func(*args, **kwargs) if kwargs else func(*args)
        t0 = _time_ns()
        tb = gather_traceback(True, False, False)
        out = func(*args, **kwargs) if kwargs else func(*args)
        self.ends.append(_time_ns())
        self.starts.append(t0)
        self.tbs.append(tb)
        return out


class MemoryEvents:
    """The profiler with ``profile_memory`` and no per-op events.

    ``torch.profiler.profile`` observes every aten op through RecordFunction
    callbacks; [memory] events do not need them (the allocator reports to the
    profiler's thread state). Enabling the profiler for ``USER_SCOPE`` only
    leaves aten ops with no active callback, so they take RecordFunction's fast
    path, and the same allocations and frees are recorded.
    """

    def __init__(self, torch_categories: bool = False) -> None:
        self._prof: Any = None
        self._result: Any = None
        self._annotations: list[dict[str, Any]] = []
        # the full profiler (every op, shapes, stacks), which _memory_profile needs
        self._full = torch_categories

    @property
    def profiler(self) -> Any:
        """The ``torch.profiler.profile`` when one ran (``torch_categories``), else None."""
        return self._prof

    def __enter__(self) -> MemoryEvents:
        if self._full:
            from torchlens.capture.memory.torch_categories import start_profiler

            self._prof = start_profiler()
            return self
        try:
            from torch._C._profiler import RecordScope, _ExperimentalConfig
            from torch.autograd import (
                ProfilerActivity,
                ProfilerConfig,
                ProfilerState,
                _enable_profiler,
                _prepare_profiler,
            )
        except ImportError:  # another torch: the public profiler, with op events
            import torch.profiler as tp

            self._prof = tp.profile(activities=[tp.ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()
            return self
        config = ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False,
                                _ExperimentalConfig(), "")
        _prepare_profiler(config, {ProfilerActivity.CPU})
        _enable_profiler(config, {ProfilerActivity.CPU}, {RecordScope.USER_SCOPE})
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            self._result = self._prof.profiler.kineto_results
        else:
            from torch.autograd import _disable_profiler

            self._result = _disable_profiler()

    def events(self) -> tuple[list[dict[str, Any]], int]:
        """The ``[memory]`` events of the chrome trace and its ``baseTimeNanoseconds``."""
        from torchlens.capture.trace.profiler import trace_json

        raw = json.loads(trace_json(self._result.save))
        base_ns = int(raw.get("baseTimeNanoseconds", 0))
        events = [e for e in raw.get("traceEvents", []) if e.get("name") == "[memory]"]
        self._annotations = annotations_from_events(raw.get("traceEvents", []), base_ns)
        return events, base_ns

    def annotations(self) -> list[dict[str, Any]]:
        """The ``record_function`` ranges of the last ``events()`` call, as a snapshot's
        ``external_annotations`` (``annotations_from_events``)."""
        return self._annotations


def annotations_from_events(trace_events: list[dict[str, Any]],
                            base_ns: int) -> list[dict[str, Any]]:
    """The profiler's ``user_annotation`` ranges (``record_function``: the user's names
    and torch's ``Optimizer.step#...``) as torch's snapshot writes them: a START and an
    END per range, ``time_us`` on the allocations' unix-microsecond axis (same flooring,
    so an allocation inside a range lies inside it here too)."""
    out = []
    for e in trace_events:
        if e.get("cat") != "user_annotation" or e.get("ph") != "X":
            continue
        start_ns = base_ns + int(e["ts"] * 1000)
        end_ns = base_ns + int((e["ts"] + e.get("dur", 0)) * 1000)
        for stage, t_ns in (("START", start_ns), ("END", end_ns)):
            out.append({"stage": stage, "name": str(e.get("name", "")), "device": 0,
                        "time_us": t_ns // 1000})
    return sorted(out, key=lambda a: a["time_us"])


def _symbolize(tbs: list[Any], depth: int) -> list[list[Frame]]:
    """Frames innermost first, as torch writes them in snapshots."""
    from torch._C._profiler import symbolize_tracebacks

    from torchlens.capture.trace.profiler import without_inductor_import

    with without_inductor_import():  # else its first call imports inductor: seconds
        symbolized = symbolize_tracebacks(tbs)
    out = []
    for frames in symbolized:
        kept = [Frame(f["filename"], f["name"], f["line"]) for f in frames
                if not f["filename"].endswith("capture/memory/cpu.py")]
        out.append(kept[:depth])
    return out


def device_trace_from_events(
    memory_events: list[dict[str, Any]],
    base_ns: int,
    recorder: SiteRecorder | None,
    depth: int,
) -> list[TraceEntry]:
    """Profiler ``[memory]`` events (CPU ones) -> trace entries as a snapshot's.

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
    trace: list[TraceEntry] = []
    op_of: list[tuple[TraceEntry, int]] = []  # an allocation and its op's number
    for e in events:
        a = e["args"]
        nbytes = int(a.get("Bytes", 0))
        t_ns = base_ns + int(e["ts"] * 1000)
        entry = TraceEntry("alloc" if nbytes > 0 else "free_completed", int(a.get("Addr", 0)),
                           abs(nbytes), 0, time_us=t_ns // 1000)
        if nbytes > 0 and depth > 0 and starts:
            i = bisect.bisect_right(starts, t_ns) - 1
            if i >= 0 and t_ns <= ends[i]:
                op_of.append((entry, wanted.setdefault(i, len(wanted))))
        trace.append(entry)
    if wanted and recorder is not None:
        order = sorted(wanted, key=wanted.get)  # type: ignore[arg-type]
        frames = _symbolize([recorder.tbs[i] for i in order], depth)
        for entry, k in op_of:
            entry.frames = frames[k]
    return trace
