"""``MemoryCapture``: run a block with allocator history on, produce a ``Profile``.

On CUDA: stats before, history on, the body, snapshot and stats after, history
off. History that was on before the cell is the user's recording: it is left
on as it was, and only the cell's entries are kept. Under
``backend:cudaMallocAsync`` (no history, no snapshot) only the stats are read,
and ``profile.unmeasured`` says so. The profile holds the snapshot in torch's own format
(``snapshots["device0"]``), so ``torch.cuda._memory_viz`` and PyTorch's
memory_viz page accept an export of it unchanged.

On a CPU-only machine: the profiler's CPU ``[memory]`` events with stacks
(``cpu_memory``) become a device trace in the same format, with no segments:
the CPU allocator has no cache. Reserved memory and fragmentation then come
from the caching-allocator model (analysis), and ``profile.unmeasured`` says so.

The body's exception (an OOM included) is recorded in ``profile.error`` and
propagates unchanged; what was captured up to then is kept.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from torchlens.capture.environment import collect_environment
from torchlens.capture.memory import cuda as cuda_memory
from torchlens.capture.memory import torch_categories as tc
from torchlens.capture.trace.native_output import quiet_native_noise
from torchlens.model import GpumemPayload, MemoryOptions, Profile, error_record
from torchlens.model.snapshot import Frame, Snapshot, TraceEntry

CPU_NOTE = (
    "GPU allocator: no CUDA device here. Allocations and frees are the CPU "
    "allocator's (profiler [memory] events); reserved memory, segments and "
    "fragmentation figures come from the allocator model (torchlens' replay of "
    "the CUDA caching allocator), not from a GPU"
)


ASYNC_NOTE = (
    "GPU allocator history: PYTORCH_CUDA_ALLOC_CONF has backend:cudaMallocAsync, which "
    "records no history and keeps no segments (torch: \"cudaMallocAsync does not yet "
    "support recordHistory\"). The figures are torch.cuda.memory_stats before and after "
    "the cell: no timeline, no allocation sites, no fragmentation")



class MemoryCapture:
    """Context manager; ``.profile`` is set on exit. ``mark_run()`` splits ``--repeat`` runs."""

    def __init__(self, options: MemoryOptions | None = None, *, title: str = "") -> None:
        self.options = options or MemoryOptions()
        self.title = title
        self.profile: Profile | None = None
        self.runs: list[tuple[int, int]] = []
        self._run_start = 0
        self._cuda = False
        self._torch_prof: Any = None
        self._categories_error = ""

    def mark_run(self) -> None:
        """Close one run of the body (for per-run growth) and open the next."""
        now = time.time_ns() // 1000
        self.runs.append((self._run_start, now))
        self._run_start = now

    def __enter__(self) -> MemoryCapture:
        self._environment = collect_environment()
        self._cuda = cuda_memory.cuda_available()
        opts = self.options
        if self._cuda:
            self._stats_before = cuda_memory.memory_stats(opts.device)
            self._start_history()
            if opts.categories == "torch":
                self._start_torch_profiler()
        else:
            self._start_cpu()
        self._created = time.time()
        self._wall0 = time.perf_counter()
        self._start_us = self._run_start = time.time_ns() // 1000
        return self

    def _start_history(self) -> None:
        """History on, unless the user's recording is on already (keep it: turning it
        off at the end would end their recording too) or the backend cannot record."""
        self._history = {"allocator_backend": cuda_memory.allocator_backend()}
        if self._history["allocator_backend"] == "cudaMallocAsync":
            self._history.update(history=False, history_error=ASYNC_NOTE)
            return
        try:
            user = cuda_memory.history_enabled()
            if user is None:
                # this torch cannot say: a history in the snapshot means someone records
                user = any(cuda_memory.take_snapshot().device_traces)
            if not user:
                cuda_memory.start_history(self.options.max_entries, self.options.stacks)
        except RuntimeError as exc:
            # e.g. a pluggable allocator: "... does not yet support recordHistory"
            self._history.update(history=False, history_error=(
                f"GPU allocator history: torch refused to record it ({exc}); the figures "
                "are memory_stats before and after the cell: no timeline, no sites, no "
                "segments"))
            return
        self._history["user_recording"] = bool(user)

    def _start_torch_profiler(self) -> None:
        """On CUDA, torch's memory profiler runs beside the allocator history; if it cannot
        start (another profiler is running), the categories are inferred and the view
        says why."""
        try:
            self._torch_prof = tc.start_profiler()
        except Exception as exc:  # noqa: BLE001 - any failure: inferred categories, one line
            self._categories_error = (f"torch's profiler could not start "
                                      f"({type(exc).__name__}: {str(exc)[:160]})")

    def _torch_categories(self, prof: Any, trace: list[TraceEntry], device: str,
                          tolerance_us: int) -> None:
        recs, why = tc.records(prof)
        if not why and not tc.annotate(trace, recs, device, tolerance_us):
            why = "torch's memory profiler named none of the cell's allocations"
        self._categories_error = why

    def _start_cpu(self) -> None:
        from torchlens.capture.memory.cpu import MemoryEvents, SiteRecorder

        self._stats_before = {}
        self._prof = MemoryEvents(torch_categories=self.options.categories == "torch")
        self._recorder = SiteRecorder() if self.options.stacks > 0 else None
        # the profiler's start/stop lines and its "block of unknown size" warning
        # for every pre-cell tensor the cell frees are torch's, not the user's
        self._quiet = quiet_native_noise()
        self._quiet.__enter__()
        try:
            self._prof.__enter__()
        except BaseException:
            self._quiet.__exit__(None, None, None)
            raise
        if self._recorder is not None:
            self._recorder.__enter__()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        wall = time.perf_counter() - self._wall0
        end_us = time.time_ns() // 1000
        if self._run_start < end_us and (not self.runs or self.runs[-1][1] < end_us):
            self.runs.append((self._run_start, end_us))
        t0 = time.perf_counter()
        unmeasured: list[str] = []
        history: dict[str, Any] = {}
        if self._cuda:
            snap, stats_after = self._stop_cuda()
            history = dict(self._history)
            if not history.get("history", True):
                unmeasured.append(history["history_error"])
        else:
            snap, stats_after = self._stop_cpu(), {}
            unmeasured.append(CPU_NOTE)
        unmeasured += self._environment.pop("unmeasured", [])
        self.profile = Profile(
            kind="gpumem",
            title=self.title,
            environment=self._environment,
            payload=GpumemPayload(
                measured_on="cuda" if self._cuda else "cpu", recorded=self.options,
                stats_before=self._stats_before, stats_after=stats_after,
                start_us=self._start_us, end_us=end_us, runs=list(self.runs),
                capture_stop_s=time.perf_counter() - t0,
                categories_error=self._categories_error, **history),
            created_at=self._created,
            wall_time_s=wall,
            source="gpumem capture" + ("" if self._cuda else " (CPU allocator events)"),
            snapshots={f"device{self.options.device}": snap},
            unmeasured=unmeasured,
            error=error_record(exc),
        )
        return False

    def _stop_cuda(self) -> tuple[Snapshot, dict[str, int]]:
        dev, h = self.options.device, self._history
        if self._torch_prof is not None:
            tc.stop_profiler(self._torch_prof)
        if not h.get("history", True):
            return Snapshot(), cuda_memory.memory_stats(dev)
        try:
            snap = cuda_memory.take_snapshot()
            stats_after = cuda_memory.memory_stats(dev)
        finally:
            if not h.get("user_recording"):
                cuda_memory.stop_history()
        traces = snap.device_traces
        h["history_entries"] = n = len(traces[dev]) if dev < len(traces) else 0
        # the user's buffer size is theirs and unknown here
        h["history_full"] = None if h.get("user_recording") else n >= self.options.max_entries
        out = _trim_snapshot(snap, self._start_us, self.options.stacks)
        if self._torch_prof is not None and dev < len(out.device_traces):
            self._torch_categories(self._torch_prof, out.device_traces[dev], f"cuda:{dev}",
                                   tc.CUDA_TOLERANCE_US)
        return out, stats_after

    def _stop_cpu(self) -> Snapshot:
        from torchlens.capture.memory.cpu import device_trace_from_events

        if self._recorder is not None:
            self._recorder.__exit__(None, None, None)
        try:
            self._prof.__exit__(None, None, None)
        finally:
            self._quiet.__exit__(None, None, None)
        events, base_ns = self._prof.events()
        trace = device_trace_from_events(events, base_ns, self._recorder, self.options.stacks)
        if self._prof.profiler is not None:
            self._torch_categories(self._prof.profiler, trace, "cpu", tc.CPU_TOLERANCE_US)
        return Snapshot([], [trace], {}, self._prof.annotations())


def _trim_snapshot(snap: Snapshot, start_us: int, depth: int) -> Snapshot:
    """Keep the history of this block only (history may have been on before) and
    at most ``depth`` Python frames per entry, dropping C++ frames (each distinct
    stack trimmed once: entries share their stacks)."""
    done: dict[int, list[Frame]] = {}

    def trim(frames: list[Frame]) -> list[Frame]:
        out = done.get(id(frames))
        if out is None:
            out = done[id(frames)] = [
                f for f in frames
                if f.filename.endswith(".py") or f.filename.startswith("<")][:depth]
        return out

    return msgspec.structs.replace(snap, device_traces=[
        [msgspec.structs.replace(e, frames=trim(e.frames)) for e in t
         if (start_us if e.time_us is None else e.time_us) >= start_us]
        for t in snap.device_traces
    ])
