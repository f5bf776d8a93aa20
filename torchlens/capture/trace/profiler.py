"""The only code that drives ``torch.profiler``.

``ProfilerCapture`` runs a block under the profiler and turns what it recorded
into a ``Profile``. Tables are built from the exported Kineto trace, never from
``prof.events()`` / ``key_averages()``: those cost 40-100 us per event in
Python, while ``export_chrome_trace`` writes 100k events in about 0.2 s.

FLOPs (``with_flops``): torch estimates them per op call (matmul, addmm,
conv, add, mul...: ``torch.autograd.profiler_util`` / the op's flop formula)
but the Kineto JSON that torch 2.x exports leaves them out. They are read from
the profiler's raw results instead (``kineto_results.events()``, about 10 us
per event, only when FLOPs were asked for; ``prof.events()`` would cost
40-100 us per event) and written into the trace table's ``flops`` column,
matched by the op's correlation id, which is the trace's ``External id``.

Steps: code marks the end of each training step with ``torchlens.step()``
(a no-op outside a capture, so the same code runs unchanged without the
profiler). Each call advances ``prof.step()``, which makes the profiler emit
``ProfilerStep#N`` ranges and drives ``--schedule WAIT,WARMUP,ACTIVE``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from contextlib import contextmanager
from functools import cache
from typing import Any

from torchlens.capture.environment import collect_environment
from torchlens.capture.trace.compiled import CompileWatch
from torchlens.capture.trace.native_output import quiet_native_noise
from torchlens.capture.trace.scaler import ScalerSteps
from torchlens.formats.kineto import ingest_bytes
from torchlens.model import (
    InputError,
    OpDisplay,
    Profile,
    ProfilerOptions,
    TorchprofPayload,
    error_record,
)

_active: list[ProfilerCapture] = []


def attach_stepper(capture: Any) -> None:
    """Make ``capture`` (a per-rank stepper with a ``step()``) the innermost
    capture that ``torchlens.step()`` reaches."""
    _active.append(capture)


def detach_stepper(capture: Any) -> None:
    """Undo ``attach_stepper``; nothing when ``capture`` is not attached."""
    if capture in _active:
        _active.remove(capture)


def innermost() -> Any:
    """The innermost running capture that ``torchlens.step()`` reaches, or None."""
    return _active[-1] if _active else None


def step() -> None:
    """Mark the end of one training step in the innermost running capture."""
    if _active:
        _active[-1].step()


class ProfilerCapture:
    """Context manager: profiles its body; ``.profile`` is set on exit.

    The body's exception (or KeyboardInterrupt) is recorded in
    ``profile.error`` and then propagates unchanged: what was captured up to
    that point is kept.
    """

    def __init__(
        self, options: ProfilerOptions | None = None, *, title: str = ""
    ) -> None:
        self.options = options or ProfilerOptions()
        self.title = title
        self.profile: Profile | None = None
        self._prof: Any = None
        self._traces: list[bytes] = []
        self._steps = 0
        self._timings: dict[str, float] = {}
        self._flops: dict[int, float] = {}  # External id -> FLOPs, last trace
        self._own_s = 0.0  # time our on_trace_ready took, since it was last read
        self._compiles = CompileWatch()  # what torch.compile did meanwhile
        self._scaler = ScalerSteps()  # GradScaler's optimizer steps and skips meanwhile

    def _activities(self) -> tuple[list[Any], list[str]]:
        import torch
        from torch.profiler import ProfilerActivity

        activities = [ProfilerActivity.CPU]
        unmeasured = []
        want_cuda = self.options.cuda
        has_cuda = torch.cuda.is_available()
        if want_cuda is None:
            want_cuda = has_cuda
        if want_cuda and has_cuda:
            activities.append(ProfilerActivity.CUDA)
        else:
            unmeasured.append(
                "GPU kernels, memcpy/memset and device time: no CUDA device here; "
                "the tables show CPU time only"
            )
        return activities, unmeasured

    def _on_trace_ready(self, prof: Any) -> None:
        t0 = time.perf_counter()
        self._traces.append(_export(prof))
        t1 = time.perf_counter()
        self._timings["export_s"] = t1 - t0
        if self.options.with_flops:
            self._flops = op_flops(prof.profiler.kineto_results.events())
            self._timings["flops_s"] = time.perf_counter() - t1
        # ours, not the profiler's: left out of the start/stop time of the
        # step() or __exit__ call it ran inside (with a schedule, a step())
        self._own_s += time.perf_counter() - t0

    def __enter__(self) -> ProfilerCapture:
        import torch.profiler as tp

        activities, self._unmeasured = self._activities()
        if self.options.schedule is not None:
            wait, warmup, active = self.options.schedule
            sched = tp.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
        else:
            # Record throughout, but with a schedule: only then does torch mark
            # ProfilerStep#N spans at each step() for the step breakdown.
            sched = _record_always
        self._prof = _profile_class()(
            activities=activities,
            record_shapes=self.options.record_shapes,
            with_stack=self.options.with_stack,
            profile_memory=self.options.profile_memory,
            with_flops=self.options.with_flops,
            schedule=sched,
            on_trace_ready=self._on_trace_ready,
        )
        self._environment = collect_environment()
        self._compiles.start()
        self._scaler.install()
        self._quiet = quiet_native_noise()  # torch's own start/stop lines, not the user's
        self._quiet.__enter__()
        t0 = time.perf_counter()
        try:
            self._prof.__enter__()
        except BaseException:
            self._quiet.__exit__(None, None, None)
            self._scaler.remove()
            raise
        self._timings["start_s"] = time.perf_counter() - t0
        self._wall0 = time.perf_counter()
        self._created = time.time()
        _active.append(self)
        return self

    def step(self) -> None:
        """``prof.step()``; with a schedule, this is where the profiler starts
        and stops recording, so its time counts as profiler start/stop time."""
        self._steps += 1
        self._own_s = 0.0
        t0 = time.perf_counter()
        self._prof.step()
        spent = time.perf_counter() - t0 - self._own_s
        self._timings["steps_s"] = self._timings.get("steps_s", 0.0) + spent

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        wall = time.perf_counter() - self._wall0
        if _active and _active[-1] is self:
            _active.pop()
        self._own_s = 0.0
        t0 = time.perf_counter()
        try:
            self._prof.__exit__(None, None, None)
        finally:
            self._quiet.__exit__(None, None, None)
        self._timings["stop_s"] = time.perf_counter() - t0 - self._own_s
        self._compiled = self._compiles.finish()
        self._scaler.remove()
        self._scaled = self._scaler.take()
        self.profile = self._build(wall, exc)
        return False

    def _build(self, wall: float, exc: BaseException | None) -> Profile:
        unmeasured = list(self._unmeasured) + self._environment.pop("unmeasured", [])
        traces = {}
        attachments = {}
        if self._traces:
            raw = self._traces[-1]
            attachments["trace.json"] = raw
            t0 = time.perf_counter()
            try:
                traces["main"] = ingest_bytes(raw, source="torchprof capture")
                if self.options.schedule is None and self._steps:
                    # torch opens ProfilerStep#N at the Nth step() call: that last
                    # span is the code after the final step, not a step.
                    traces["main"].meta["tail_step"] = f"ProfilerStep#{self._steps}"
                if self.options.with_flops:
                    n = fill_flops(traces["main"], self._flops)
                    if n == 0:
                        unmeasured.append(
                            "FLOPs: torch estimated none for the ops this cell ran "
                            "(it counts matrix multiplies, convolutions and a few "
                            "elementwise ops); the FLOPs and FLOP/s columns are empty")
            except InputError as err:
                # e.g. a cell that ran no torch op: say so, keep the cell's own error
                unmeasured.append(f"no profiler events to show: {err}")
            self._timings["ingest_s"] = time.perf_counter() - t0
        elif self.options.schedule is not None:
            wait, warmup, active = self.options.schedule
            unmeasured.append(
                f"no trace: the schedule waits {wait}, warms up {warmup} and records "
                f"{active} steps ({wait + warmup + active} in all), but the cell "
                f"marked {self._steps} step(s). Call torchlens.step() at the end of "
                "each step, or lower the schedule."
            )
        o = self.options
        payload = TorchprofPayload(
            # a column the user asked the profiler to record is one they want to see
            display=OpDisplay(shapes=o.record_shapes, stack=o.with_stack, flops=o.with_flops),
            recorded=o, timings=dict(self._timings),
            profiler_overhead_s=sum(self._timings.get(k, 0.0)
                                    for k in ("start_s", "stop_s", "steps_s")),
            steps_marked=self._steps, compiled=self._compiled, scaler=self._scaled)
        return Profile(
            kind="torchprof",
            title=self.title,
            environment=self._environment,
            payload=payload,
            created_at=self._created,
            wall_time_s=wall,
            source="torchprof capture",
            traces=traces,
            unmeasured=unmeasured,
            error=error_record(exc),
            attachments=attachments,
        )


def op_flops(events: Any) -> dict[int, float]:
    """External id -> FLOPs of each op call torch estimated FLOPs for.

    ``events`` are the profiler's raw ``_KinetoEvent`` objects: their
    ``correlation_id()`` is the ``External id`` the exported trace gives the op.
    """
    out = {}
    for e in events:
        flops = e.flops()
        if flops:
            out[int(e.correlation_id())] = float(flops)
    return out


def fill_flops(trace: Any, flops: dict[int, float]) -> int:
    """Write ``flops`` (External id -> FLOPs) into the ops of ``trace``'s table.

    Only ``cpu_op`` rows take them (runtime calls and kernels carry their op's
    External id too) and only where the trace itself has none. Returns the
    number of op calls given FLOPs.
    """
    import numpy as np

    ev = trace.events
    column = ev["flops"].copy()
    if not flops:
        return int(np.isfinite(column).sum())
    cats = ev.categories["cat"]
    is_op = ev["cat"] == (cats.index("cpu_op") if "cpu_op" in cats else -2)
    keys = np.fromiter(flops, np.int64, len(flops))
    values = np.fromiter(flops.values(), np.float64, len(flops))
    order = np.argsort(keys)
    keys, values = keys[order], values[order]
    ext = ev["external_id"]
    pos = np.clip(np.searchsorted(keys, ext), 0, len(keys) - 1)
    hit = is_op & (ext >= 0) & (keys[pos] == ext) & np.isnan(column)
    column[hit] = values[pos[hit]]
    ev.columns["flops"] = column
    return int(np.isfinite(column).sum())


@cache
def _profile_class() -> type:
    """``torch.profiler.profile`` that does not import torch._inductor to start.

    Its ``prepare_trace`` asks ``hasattr(torch, "_inductor")``, and torch's lazy
    module ``__getattr__`` answers by importing torch._inductor and with it
    torch._dynamo: 2-5 s on the first ``%%torchprof`` of a kernel (most of its
    cold start), only to read ``inductor_config.triton.cudagraphs``. Until
    something imports inductor that flag cannot have been set, so while
    ``torch._inductor`` is not in ``sys.modules`` the check is answered "no"
    without the import. The price: a cell that calls ``torch.compile`` for the
    first time under the profiler also records inductor's own import and lazy
    set-up (torch imports it up front to keep those ops out of the trace), next
    to a first compile that takes far longer anyway.
    """
    import torch.profiler as tp

    class Profile(tp.profile):
        def prepare_trace(self) -> None:
            if "torch._inductor" in sys.modules:
                super().prepare_trace()
                return
            with without_inductor_import():
                super().prepare_trace()

    return Profile


@contextmanager
def without_inductor_import() -> Any:
    """While inside, ``torch._inductor`` is an AttributeError instead of a lazy import.

    For torch calls that look at inductor only in case it is in use: the
    profiler's ``prepare_trace`` (above) and ``symbolize_tracebacks`` (the
    allocation sites of ``%%gpumem``, which would map inductor-generated code
    back to its source). Wraps the ``torch`` module's ``__getattr__`` for the
    duration of that call; every other name goes to torch's own hook, and once
    inductor is imported its attribute is found before any hook is asked.
    """
    import torch

    lazy = torch.__dict__.get("__getattr__")
    if lazy is None:  # a torch without lazy submodules: nothing to avoid
        yield
        return

    def getattr_(name: str) -> Any:
        if name == "_inductor":
            raise AttributeError(name)
        return lazy(name)

    torch.__getattr__ = getattr_
    try:
        yield
    finally:
        torch.__getattr__ = lazy


def _record_always(step: int) -> Any:
    from torch.profiler import ProfilerAction

    return ProfilerAction.RECORD


def _export(prof: Any) -> bytes:
    """The profiler's Kineto trace as JSON bytes (Kineto's own C++ writer)."""
    return trace_json(prof.export_chrome_trace)


def trace_json(write: Any) -> bytes:
    """What ``write(path)`` puts in a private temp file: Kineto writes only to
    paths, so its traces reach us through one."""
    fd, path = tempfile.mkstemp(prefix="torchlens-", suffix=".json")
    os.close(fd)
    try:
        write(path)
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        os.unlink(path)
