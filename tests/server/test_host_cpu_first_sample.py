"""The monitor's first host-CPU reading is measured, not the
0 % psutil gives for a window of a few microseconds (a fake dip on every
``%gpumonitor`` and sidebar start)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from torchlens.capture.monitor.host import HostSampler


@contextlib.contextmanager
def _busy_core() -> Iterator[None]:
    """One core kept busy by a spinning thread for the block's duration."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    busy = threading.Thread(target=spin, daemon=True)
    busy.start()
    try:
        yield
    finally:
        stop.set()
        busy.join()


def test_first_cpu_sample_sees_a_busy_core() -> None:
    with _busy_core():
        time.sleep(0.05)
        first = HostSampler().sample().cpu_percent
    assert first is not None and first > 0, f"first CPU sample {first} % with a core busy"


def test_a_sample_in_the_samplers_thread_is_measured_too() -> None:
    """The Jupyter server makes its HostSampler on its loop and samples
    in the monitor's thread; psutil (>= 5.9.6) keeps a baseline per thread, so that
    thread's first ``cpu_percent`` read 0.0 with load1 at 14 (``/metrics`` exported it)."""
    sampler = HostSampler()  # the server's loop thread
    got: list = []
    with _busy_core():
        time.sleep(0.3)
        reader = threading.Thread(target=lambda: got.append(sampler.sample().cpu_percent))
        reader.start()
        reader.join()
    assert got[0] is not None and got[0] > 0, f"CPU {got[0]} % in the sampler's thread, a core busy"
