"""Two host figures of a rank's step that no phase timer sees: time in Python's
garbage collections, and time the training thread waited for a CPU.

A full collection walks every tracked object: with millions of them a pause
lands in whichever phase allocated last, and reads as slow compute. A rank
whose core another process uses waits, runnable, in the kernel's run queue,
and that too reads as slow compute. Both are measured here so the slow-rank
rule can name them (``analysis.ranks.slow``: causes ``gc`` and
``cpu_contention``):

- ``gc.callbacks`` (start/stop around each collection, in the thread that
  triggered it): the time between them, summed;
- ``/proc/thread-self/schedstat`` of the thread that calls ``take`` (Linux:
  its first field is the nanoseconds it ran on a CPU, its second those it
  waited on a run queue), read at each step's end: the difference is the
  step's. Elsewhere it is not measured. Its time on a CPU tells a rank that
  waits for a CPU because it has more work (on a busy machine a long-running
  thread waits longer than one that runs in short bursts) from one whose core
  another process takes.

Fails open: a callback that raises is torchlens' bug, counted and dropped,
never the job's; the callback comes off with ``remove``.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

from torchlens.model.records import HostStep


def _sched_ns() -> tuple[int, int] | None:
    """The calling thread's time on a CPU and its run-queue wait so far (ns),
    None where not readable."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb") as fh:
            fields = fh.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


class HostTime:
    """Garbage-collection and run-queue time per step (module docstring)."""

    def __init__(self) -> None:
        self._gc_s = 0.0
        self._gc_t0: float | None = None
        self._sched = _sched_ns()
        self.errors = 0
        self._installed = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        try:
            if phase == "start":
                self._gc_t0 = time.perf_counter()
            elif self._gc_t0 is not None:
                self._gc_s += time.perf_counter() - self._gc_t0
                self._gc_t0 = None
        except Exception:  # noqa: BLE001 - torchlens' own error: the collection goes on
            self.errors += 1

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True
            self._sched = _sched_ns()

    def remove(self) -> None:
        if self._installed:
            try:
                gc.callbacks.remove(self._on_gc)
            except ValueError:
                pass
            self._installed = False

    def take(self) -> HostStep | None:
        """The figures since the last call (the step that just ended)."""
        gc_s, self._gc_s = self._gc_s, 0.0
        now, before = _sched_ns(), self._sched
        self._sched = now
        if not self._installed:
            return None
        if now is None or before is None:
            return HostStep(gc_s=round(gc_s, 7))
        return HostStep(gc_s=round(gc_s, 7), runq_s=round((now[1] - before[1]) / 1e9, 7),
                        cpu_s=round((now[0] - before[0]) / 1e9, 7))

