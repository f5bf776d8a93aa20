"""Ring buffer, rate control, rank samples and CSV of the server-wide monitor."""

from __future__ import annotations

import csv
import io
import time

from fake_nvml import FakeNvml, gpu
from sampler_doubles import NoGpu, StepHost

from torchlens.capture.gpu_sampler import NvmlSampler
from torchlens.frontends.server.monitor import (
    MAX_INTERVAL,
    MIN_INTERVAL,
    History,
    Monitor,
)


def test_history_keeps_only_the_last_seconds() -> None:
    h = History(seconds=10, max_items=100)
    for t in range(100, 131):
        h.append({"t": float(t)})
    assert [s["t"] for s in h.since(0)] == [float(t) for t in range(120, 131)]
    assert [s["t"] for s in h.since(128.5)] == [129.0, 130.0]
    assert h.since(130.0) == [] and h.last_time() == 130.0


def test_history_is_bounded_by_count_too() -> None:
    h = History(seconds=1e9, max_items=5)
    for t in range(20):
        h.append({"t": float(t)})
    assert len(h) == 5 and h.since(0)[0]["t"] == 15.0


def test_rate_drops_when_nobody_asks_and_rises_on_request() -> None:
    mon = Monitor(StepHost(), NoGpu(), interval=0.5, idle_interval=10, idle_after=30)
    assert mon.idle and mon.current_interval() == 10
    mon.touch()
    assert not mon.idle and mon.current_interval() == 0.5
    mon.idle_after = 0.0
    time.sleep(0.01)
    assert mon.current_interval() == 10


def test_interval_is_clamped() -> None:
    mon = Monitor(StepHost(), NoGpu())
    assert mon.set_interval(0.0001) == MIN_INTERVAL
    assert mon.set_interval(1e6) == MAX_INTERVAL
    assert mon.set_interval(2) == 2.0


def test_thread_samples_and_stop_closes_samplers() -> None:
    gpu_sampler = NoGpu()
    mon = Monitor(StepHost(), gpu_sampler, interval=0.05, idle_interval=0.05)
    mon.start()
    deadline = time.time() + 5
    while len(mon.history) < 3 and time.time() < deadline:
        time.sleep(0.02)
    mon.stop()
    assert len(mon.history) >= 3 and gpu_sampler.closed
    taken = mon.samples_taken
    time.sleep(0.15)
    assert mon.samples_taken == taken


def test_rank_samples_are_kept_per_run() -> None:
    mon = Monitor(StepHost(), NoGpu())
    now = time.time()
    samples = [
        {"rank": 1, "t": now, "allocated": 10, "reserved": 20},
        {"rank": 0, "allocated": None},
    ]
    assert mon.add_rank_samples("run1", samples) == 2
    first, second = mon.ranks.since(0)
    assert first == {
        "t": now,
        "run": "run1",
        "rank": 1,
        "device": None,
        "allocated": 10,
        "reserved": 20,
    }
    assert second["rank"] == 0 and second["allocated"] is None and second["t"] >= now
    mon.add_rank_samples("run1", [{"rank": 0, "t": now + 1000}])  # ten minutes later
    assert [r["t"] for r in mon.ranks.since(0)] == [now + 1000]


def test_csv_has_one_row_per_sample_and_empty_cells_for_na() -> None:
    ns = __import__("pynvml").NVMLError_NotSupported
    nvml = NvmlSampler(
        api=FakeNvml([gpu("GPU-a", temp=ns)]), environ={}, process_name=lambda p: None
    )
    mon = Monitor(StepHost(), nvml)
    for _ in range(3):
        mon.sample_once()
    rows = list(csv.DictReader(io.StringIO(mon.to_csv())))
    assert len(rows) == 3
    assert rows[2]["host_cpu_percent"] == "3.0"
    assert rows[0]["gpu0_util_gpu"] == "42" and rows[0]["gpu0_temp_c"] == ""
    # NVLink is a rate of counters: n/a on the first row, then a number (idle fake: 0)
    assert rows[0]["gpu0_nvlink_tx_bps"] == "" and rows[0]["gpu0_nvlink_rx_bps"] == ""
    assert float(rows[2]["gpu0_nvlink_tx_bps"]) == 0.0
