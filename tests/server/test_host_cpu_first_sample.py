"""Issue 21 item 2: the monitor's first host-CPU reading is measured, not the
0 % psutil gives for a window of a few microseconds (a fake dip on every
``%gpumonitor`` and sidebar start)."""

from __future__ import annotations

import threading
import time

from torchlens.capture.monitor.host import HostSampler


def test_first_cpu_sample_sees_a_busy_core() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    busy = threading.Thread(target=spin, daemon=True)
    busy.start()
    try:
        time.sleep(0.05)
        first = HostSampler().sample()["cpu_percent"]
    finally:
        stop.set()
        busy.join()
    assert first is not None and first > 0, f"first CPU sample {first} % with a core busy"
