"""The rank side of ``%ddp_check --profile``: step records, profiled steps, windows.

The phases of each step are timed by ``phases.PhaseClock``; on a rank whose
job uses CUDA also on the GPU (``phases.GpuPhaseTimer``): a step's GPU times
travel with the first record after its CUDA events completed (``gpu``).

Why one torch.profiler per profiled step (``start()`` at the end of the step
before, ``stop()`` in its own ``step()`` call) instead of a ``schedule``: the
interval between profiled steps is decided after the first one (the budget
below), which a schedule fixes up front. ``step_num`` is set so the trace's
``ProfilerStep#N`` is the step's own index.

The budget: ``--profile`` alone profiles steps ``MIN_EVERY - 1`` and
``2 * MIN_EVERY - 1``, then one step in ``every``, where every rank proposes
the smallest interval that keeps its measured profiling cost (the second
profiled step's extra time, start, stop and export, plus the CPU its summary
took) under ``budget`` of its step time, and all ranks take the largest
proposal (through the store, once), so they profile the same steps and the
joint timeline lines up. ``--profile-every N`` fixes the interval instead.

The profiled step's trace is exported by the training thread (about 1 ms;
the profiler's data lives there) and read and summarised by a background
thread (the C scanner releases the GIL), so the next step is not held up.
Summaries and step records leave through the worker's heartbeat thread.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import torch
from msgspec import UNSET

from torchlens.capture.ranks import cuda_device
from torchlens.capture.ranks.autostep import (
    EXPLICIT,
    OptimizerBoundary,
    optimizer_words,
    window_words,
)
from torchlens.capture.ranks.heap import heap_in_use
from torchlens.capture.ranks.host_time import HostTime
from torchlens.capture.ranks.phases import (
    MAX_PENDING,
    PHASES,
    GpuPhaseTimer,
    PhaseClock,
)
from torchlens.capture.trace import profiler as _profiler
from torchlens.capture.trace.compiled import CompileSteps
from torchlens.capture.trace.scaler import ScalerSteps
from torchlens.model.messages import RankProgress
from torchlens.model.rank_report import BudgetFigures
from torchlens.model.records import (
    GpuStepTimes,
    StepMemory,
    StepRecord,
    StepSummary,
)

MIN_EVERY = 5
BUDGET = 0.03
MAX_EVERY = 10_000
#: Before the first window is cut: set-up (building the model, DDP's first
#: broadcast, importing torch._dynamo) can take seconds before a first step()
FIRST_WINDOW_S = 10.0
AGREE_WAIT_S = 10.0
_PROCESS = psutil.Process(os.getpid())



class StepLimit(BaseException):
    """``--steps N`` reached: ends the user's loop on every rank at the same step.

    A BaseException so a user's ``except Exception`` does not swallow it."""


_PAGE = os.sysconf("SC_PAGE_SIZE")
_STATM: int | None = None


def rss_bytes() -> int:
    """Resident set size from ``/proc/self/statm`` (a few µs; psutil takes ~16 µs)."""
    global _STATM
    try:
        if _STATM is None:
            _STATM = os.open("/proc/self/statm", os.O_RDONLY)
        return int(os.pread(_STATM, 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):  # not Linux
        return _PROCESS.memory_info().rss


def memory_now(device: torch.device) -> StepMemory:
    """The step's memory: ``device``'s allocator counters (one stats read), or RSS
    alone; with the C heap's bytes in use either way (about 1 µs)."""
    got = cuda_device.counters(device)
    heap = heap_in_use()
    held = heap if heap is not None else UNSET
    if got is None:
        return StepMemory(rss=rss_bytes(), source="rss", heap=held)
    return StepMemory(rss=rss_bytes(), source="cuda", heap=held, **got)


class RankProfiler:
    """One rank's ``--profile`` capture; ``torchlens.step()`` calls ``step()``.

    Without such calls the steps end at the job's optimizer steps
    (``autostep``), and without those in fixed windows of ``window_s``;
    ``steps_by`` says which (None before the first step ends).

    ``summarize(trace_path, rank=, step=, trace_rel=, cuda_memory=)`` turns an
    exported trace into a bounded summary (injected: capture does not analyse);
    its ``warm()``, if it has one, runs first on the summary thread (its imports).
    ``agree(proposal)`` returns the interval every rank takes (the store).
    ``fsdp``: a tracker of FSDP's gathered parameters and optimizer state
    (``capture.ranks.fsdp_memory``, ``torchlens run``), counting from
    ``start()``, its figures taken into each step's record.
    ``device=None``: the device the script chose, decided at the first step
    (``cuda_device.script_device``), not where the rank attached: with
    per-rank ``CUDA_VISIBLE_DEVICES`` every rank's GPU is ``cuda:0``, and a
    job on the CPU of a GPU host uses no GPU at all.
    """

    def __init__(self, *, rank: int, run_dir: str, device: torch.device | None,
                 every: int | None, budget: float = BUDGET, window_s: float = 1.0,
                 max_steps: int | None = None,
                 summarize: Callable[..., StepSummary] | None = None,
                 agree: Callable[[int], int] | None = None, fsdp: Any = None) -> None:
        self.rank = rank
        self.fsdp = fsdp
        self.auto_device = device is None
        self.device = device or cuda_device.CPU
        self.run_dir = run_dir
        self.fixed_every = every
        self.every = every or MIN_EVERY
        #: False: step records only, torch.profiler never started
        #: (``torchlens run --no-profile``)
        self.profiling = True
        #: in torch.profiler's stop and trace export (the training thread's,
        #: seconds for a step of many events): busy in torchlens, not hung
        self.exporting = False
        self.budget, self.window_s, self.max_steps = budget, window_s, max_steps
        self.summarize, self.agree = summarize, agree
        self.clock = PhaseClock()
        self.host = HostTime()
        self.compiles = CompileSteps()  # what torch.compile compiled in each step
        self.scaler = ScalerSteps()  # GradScaler's skipped steps and scale
        self.records: list[StepRecord] = []  # not yet sent (drained by the heartbeat)
        self.summaries: queue.Queue[StepSummary] = queue.Queue()
        self.errors: list[str] = []
        self.index = 0  # the step now running
        self.next_profiled = self.every - 1
        self.real_steps = False
        self.windows = False
        self.found = OptimizerBoundary()
        self.scaler.on_skip = self.found.stepped  # a skipped step ends a step too
        self.steps_by: str | None = None
        #: (label, by) of a span a callback began, ended at the next phase
        self.label_next: tuple[str, str] | None = None
        self.own_s = 0.0  # torchlens' own time inside step() calls
        self.prof: Any = None
        self._prof_stopped = False
        self._profiled = 0  # profiled steps so far
        self._summary_cpu: list[float] = []  # CPU seconds of each summary (ingest thread)
        self._summarised = threading.Event()
        self.budget_figures = BudgetFigures()
        self._prof_t0 = 0.0
        self._walls: list[float] = []
        #: traces to summarise: path, step, and the CUDA allocator's counters at its end
        self._work: queue.Queue[tuple[str, int, dict[str, int | str | None] | None] | None] = (
            queue.Queue())
        self._worker: threading.Thread | None = None
        self.t_mark = 0.0
        self._said_dropped = False

    # -- lifecycle ---------------------------------------------------------
    def settle_device(self) -> torch.device:
        """The device whose memory and kernels this rank records (see the class)."""
        if self.auto_device:
            self.device = cuda_device.script_device()
        return self.device

    def uses_cuda(self) -> bool:
        """Whether the profiler may record CUDA: the job is on a GPU and CUDA is
        up (``profile.__exit__`` synchronises the device of CUDA activity)."""
        return self.device.type == "cuda" and cuda_device.cuda_in_use()

    def start(self) -> None:
        self.settle_device()
        os.makedirs(os.path.join(self.run_dir, f"rank{self.rank}"), exist_ok=True)
        self.clock.install()
        self.host.install()
        self.scaler.install()
        self.clock.tick = self._window_tick
        self.found.install()  # after the clock's hooks: its optimizer time is taken first
        self.clock.enter = self._enter
        self._worker = threading.Thread(target=self._ingest, daemon=True, name="tl-ingest")
        self._worker.start()
        self._time_gpu()
        if self.fsdp is not None:
            # torchlens run (the script's device): the job's own allocator peak is left
            # alone; %ddp_check --profile's device is its own, its peak read over the run
            self.fsdp.start(None if self.auto_device else self.device)
        _profiler.attach_stepper(self)
        self.t_mark = time.time()
        self.window_end = self.t_mark + max(self.window_s,
                                            min(FIRST_WINDOW_S, 5 * self.window_s))
        if self.next_profiled == 0:
            self._start_profiler()

    def finish(self, wait_s: float = 30.0, setup_is_step: bool = True) -> None:
        """The function returned (or raised): close the open step, wait for summaries.

        ``setup_is_step=False``: a process attached when it started
        (``torchlens run``) that ended before its first step or window ran
        only set-up, or nothing of the script at all (a mistyped path):
        its open window is not a step."""
        _profiler.detach_stepper(self)
        self.clock.tick = self.clock.enter = None
        self.found.remove()
        last = self.found.take()
        if last is not None:  # the last optimizer step ends the last step: then teardown
            with contextlib.suppress(StepLimit):
                self.step(found=True, t1=last)
        if not self.real_steps and time.time() > self.t_mark and (
                setup_is_step or self.windows):
            with contextlib.suppress(StepLimit):
                self.step(window=True)  # a function without step(): its last window
        elif self.prof is not None:  # a profiled step the function never finished
            self._stop_profiler(self.index, partial=True)
        self.clock.remove()
        self.host.remove()
        self.scaler.remove()
        if self.fsdp is not None:
            self.fsdp.finish()
        self._work.put(None)
        if self._worker is not None:
            self._worker.join(timeout=wait_s)

    def _time_gpu(self) -> None:
        """Time the phases on the GPU too when the job uses CUDA (its device is a
        GPU and CUDA is up: a CPU rank never starts CUDA for it); from the next
        step boundary on."""
        gpu = self.clock.gpu
        if gpu is not None and gpu.device == self.device:
            return
        self.clock.gpu = GpuPhaseTimer(self.device) if self.uses_cuda() else None
        if self.clock.gpu is not None:
            self.clock.gpu.begin()

    def _gpu_times(self, i: int) -> list[GpuStepTimes] | None:
        """Mark the end of step ``i`` and read the steps whose events completed."""
        gpu = self.clock.gpu
        if gpu is None:
            return None
        gpu.mark(i)
        out = [GpuStepTimes(step=n, step_s=round(step_s, 7),
                            phases={p: round(v, 7) for p, v in zip(PHASES, per, strict=True)})
               for n, step_s, per in gpu.ready()]
        if gpu.error is not None:
            self.errors.append(f"step {i}: phases are timed on the host only from here: "
                               f"{gpu.error}")
            self.clock.gpu = None
        elif gpu.dropped and not self._said_dropped:  # once: it repeats every step
            self._said_dropped = True
            self.errors.append(f"step {i}: GPU times of some steps not read: the GPU was "
                               f"more than {MAX_PENDING} steps behind the host")
        return out

    def status(self) -> RankProgress:
        return RankProgress(steps_done=self.index, phase_calls=self.clock.entries,
                            steps_by=self.steps_by, device=str(self.device))

    def drain(self) -> tuple[list[StepRecord], list[StepSummary]]:
        """New step records and summaries, for the heartbeat thread to send."""
        records, self.records = self.records, []
        out = []
        while True:
            try:
                out.append(self.summaries.get_nowait())
            except queue.Empty:
                return records, out

    # -- steps -------------------------------------------------------------
    def _window_tick(self) -> None:
        if not self.real_steps and time.time() >= self.window_end:
            self.step(window=True)

    def _enter(self) -> None:
        """A phase begins: a step found at the optimizer's last step ends here,
        and so does a labelled span a callback began (``label_next``)."""
        if self.label_next is not None:
            (label, by), self.label_next = self.label_next, None
            self.step(by=by, label=label)
        if self.found.take() is not None:
            self.step(found=True)

    def step(self, window: bool = False, found: bool = False, t1: float | None = None,
             *, by: str | None = None, label: str | None = None) -> None:
        """The end of step ``self.index``: record it, drive the profiler.

        ``torchlens.step()`` calls it bare, and from then on only it ends steps
        (its call wins over the optimizer's); ``found``: at an optimizer step
        (``autostep``); ``window``: a fixed window's end. ``by``: a framework's
        callback (``torchlens.integrations``) ends it, said so in ``steps_by``;
        it wins over the optimizer's as an explicit call does. ``label``: the
        span was not a training step (``StepRecord.label``)."""
        if found:
            self.steps_by = optimizer_words(self.found.name or "an optimizer")
        elif by is not None:
            self.found.off, self.found.pending = True, None
            self.steps_by = by
        elif not window:
            self.found.off, self.found.pending = True, None
            self.steps_by = EXPLICIT
        elif not self.real_steps:
            self.steps_by = window_words(self.window_s)
        called = time.time()
        t1 = called if t1 is None else t1
        gpu = self._gpu_times(self.index)  # before the profiler's stop syncs the device
        stopped = self._stop_recording()  # the trace's ProfilerStep span ends next to t1
        if not window:
            if not self.real_steps and self.windows:
                self._windows_were_set_up()
                gpu = None  # the windows' GPU times: set-up too
            self.real_steps = True
        else:
            self.windows = True
            self.window_end = t1 + self.window_s
        i = self.index
        profiled = self.prof is not None and stopped
        phases = self.clock.take()
        if i == 0 and not window and self.clock.first is not None:
            # building the model and DDP's first broadcast come before step 0's
            # first phase: set-up, not the step
            self.t_mark = max(self.t_mark, min(self.clock.first, t1))
        if i == 0:
            self.settle_device()  # the script has run its first step: its device is set
            self._time_gpu()
        mem = memory_now(self.device)
        fsdp = self.fsdp.take() if self.fsdp is not None else None
        ddp = self.clock.take_ddp()
        host = self.host.take()
        compiled, so_far = self.compiles.take(), self.compiles.so_far()
        scaler = self.scaler.take()
        if profiled:
            self._stop_profiler(i, mem=mem)
        elif label is None:  # an evaluation's length is no measure of the budget
            self._walls.append(t1 - self.t_mark)
        self.records.append(StepRecord(step=i, t0=self.t_mark, t1=t1, phases=phases,
                                       profiled=profiled, window=window, mem=mem,
                                       tl_s=round(time.time() - called, 6),
                                       **({"gpu": gpu} if gpu else {}),
                                       **({"fsdp": fsdp} if fsdp is not None else {}),
                                       **({"ddp": ddp} if ddp is not None else {}),
                                       **({"host": host} if host is not None else {}),
                                       **({"compiled": compiled} if compiled is not None
                                          else {}),
                                       **({"compiled_so_far": so_far} if so_far is not None
                                          else {}),
                                       **({"scaler": scaler} if scaler is not None else {}),
                                       **({"label": label} if label else {})))
        self.index = i + 1
        if self.max_steps is not None and self.index >= self.max_steps:
            self.t_mark = time.time()
            raise StepLimit
        if self.index == self.next_profiled:
            self._start_profiler()
        self.t_mark = time.time()
        self.own_s += self.t_mark - called

    def _windows_were_set_up(self) -> None:
        """A first step() after windows were cut: those windows were set-up.

        Steps count from 0 again (``--steps`` counts real steps, and profiled
        steps line up with the other ranks'); the kernel drops the window
        records of a rank that has real steps.
        """
        self.clock.tick = None
        self._stop_recording()
        self.prof, self._prof_stopped = None, False
        if self.clock.gpu is not None:
            self.clock.gpu.begin()
        self.index = 0
        self.next_profiled = self.every - 1 if self.fixed_every else MIN_EVERY - 1
        self.every = self.fixed_every or MIN_EVERY
        self._profiled = 0

    # -- the profiler --------------------------------------------------------
    def _start_profiler(self) -> None:
        if not self.profiling:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        cuda = self.uses_cuda()
        if cuda:
            activities.append(ProfilerActivity.CUDA)
        self._prof_t0 = time.perf_counter()
        try:
            prof = profile(activities=activities, profile_memory=not cuda)
            prof.step_num = self.index
            prof.record_steps = True  # ProfilerStep#N spans, as with a schedule
            prof.start()
        except Exception as exc:  # noqa: BLE001 - a profiler already on (the user's own)
            self.errors.append(f"step {self.index}: torch.profiler did not start: {exc}")
            self.next_profiled = -1
            return
        self.prof = prof

    def _stop_recording(self) -> bool:
        """Stop the running profiler (if any); True when it stopped cleanly."""
        if self.prof is None or self._prof_stopped:
            return self._prof_stopped
        busy, self.exporting = self.exporting, True
        try:
            self.prof.stop()
        except Exception as exc:  # noqa: BLE001 - reported; the run goes on unprofiled
            self.errors.append(f"step {self.index}: torch.profiler did not stop: {exc}")
            self.prof, self.next_profiled = None, -1
            return False
        finally:
            self.exporting = busy
        self._prof_stopped = True
        return True

    def _stop_profiler(self, i: int, partial: bool = False,
                       mem: StepMemory | None = None) -> None:
        self.exporting = True
        try:
            self._stop_and_export(i, partial, mem)
        finally:
            self.exporting = False

    def _stop_and_export(self, i: int, partial: bool, mem: StepMemory | None) -> None:
        self._stop_recording()
        prof, self.prof = self.prof, None
        self._prof_stopped = False
        if prof is None:
            return
        path = os.path.join(self.run_dir, f"rank{self.rank}", f"step{i:05d}.pt.trace.json")
        try:
            prof.export_chrome_trace(path)
        except Exception as exc:  # noqa: BLE001 - reported; the run goes on unprofiled
            self.errors.append(f"step {i}: the trace could not be written: {exc}")
            self.next_profiled = -1
            return
        cost = time.perf_counter() - self._prof_t0
        cuda = None
        if self.uses_cuda():
            cuda = {**(mem or memory_now(self.device)).to_dict(),
                    "largest_free": cuda_device.largest_free(self.device)}
        self._work.put((path, i, cuda))
        if partial:
            return
        self._profiled += 1
        if self.fixed_every is None and self._profiled == 2:
            self.every = self._agreed_every(cost)
        self.next_profiled = i + self.every

    def _agreed_every(self, cost_s: float) -> int:
        """The interval that keeps this rank's profiling under the budget.

        Measured at the second profiled step (the first pays one-time costs:
        Kineto's start-up): the profiled step's extra wall time, start, stop
        and export, plus the CPU time its summary took in the background
        thread (the next steps pay that, on a machine whose cores the ranks
        share), over ``budget`` x the median unprofiled step.
        """
        typical = statistics.median(self._walls) if self._walls else cost_s
        self._summarised.wait(timeout=2.0)  # the first summary's CPU time
        summary_cpu = statistics.median(self._summary_cpu) if self._summary_cpu else 0.0
        extra = max(0.0, cost_s - typical) + summary_cpu
        mine = MIN_EVERY if typical <= 0 else math.ceil(extra / (self.budget * typical))
        mine = min(MAX_EVERY, max(MIN_EVERY, mine))
        self.budget_figures = BudgetFigures(typical_step_s=typical, profiled_extra_s=extra,
                                            summary_cpu_s=summary_cpu, proposed_every=mine)
        if self.agree is None:
            return mine
        try:
            return self.agree(mine)
        except Exception:  # noqa: BLE001 - a peer gone: keep our own interval
            return mine

    def _ingest(self) -> None:
        warm = getattr(self.summarize, "warm", None)
        if warm is not None:  # the summariser's imports, during set-up, not in a step
            try:
                warm()
            except Exception as exc:  # noqa: BLE001 - the first summary will say it again
                self.errors.append(f"summary imports failed: {type(exc).__name__}: {exc}")
        while True:
            job = self._work.get()
            if job is None:
                return
            path, step, cuda = job
            if self.summarize is None:
                continue
            cpu0 = time.thread_time()
            try:
                summary = self.summarize(
                    path, rank=self.rank, step=step,
                    trace_rel=os.path.relpath(path, self.run_dir), cuda_memory=cuda)
            except Exception as exc:  # noqa: BLE001 - one bad step must not end the run
                self.errors.append(f"step {step}: summary failed: {type(exc).__name__}: {exc}")
                continue
            finally:
                self._summary_cpu.append(time.thread_time() - cpu0)
                self._summarised.set()
            self.summaries.put(summary)
