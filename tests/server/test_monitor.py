"""Ring buffer, rate control, rank samples and CSV of the server-wide monitor."""

from __future__ import annotations

import csv
import io
import math
import time

import msgspec
import pytest
from fake_nvml import FakeNvml, gpu
from sampler_doubles import NoGpu, StepHost

from torchlens.capture.monitor.gpu import NvmlSampler
from torchlens.frontends.monitor.sampler import (
    MAX_INTERVAL,
    MIN_INTERVAL,
    History,
    Monitor,
)
from torchlens.model.messages import DdpHeartbeat
from torchlens.model.samples import RankSample


def _at(t: float) -> RankSample:
    return RankSample(t=t, run="r", rank=0)


def test_history_keeps_only_the_last_seconds() -> None:
    h = History(seconds=10, max_items=100)
    for t in range(100, 131):
        h.append(_at(float(t)))
    assert [s.t for s in h.since(0)] == [float(t) for t in range(120, 131)]
    assert [s.t for s in h.since(128.5)] == [129.0, 130.0]
    assert h.since(130.0) == [] and h.last_time() == 130.0


def test_history_is_bounded_by_count_too() -> None:
    h = History(seconds=1e9, max_items=5)
    for t in range(20):
        h.append(_at(float(t)))
    assert len(h) == 5 and h.since(0)[0].t == 15.0


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
    first, second = msgspec.to_builtins(mon.ranks.since(0))
    assert first == {
        "t": now,
        "run": "run1",
        "rank": 1,
        "device": None,
        "allocated": 10,
        "reserved": 20,
        "inactive_split": None,
        "largest_free": None,
        "source": None,
    }
    assert second["rank"] == 0 and second["allocated"] is None and second["t"] >= now
    mon.add_rank_samples("run1", [{"rank": 0, "t": now + 1000}])  # ten minutes later
    assert [r.t for r in mon.ranks.since(0)] == [now + 1000]


PROFILED = {"rank": 1, "t": 100.0, "device": None, "allocated": 1048576,
            "reserved": 2097152, "inactive_split": 4096, "largest_free": 1044480,
            "source": "modelled"}


def test_rank_samples_keep_the_allocator_figures_of_a_profiled_run() -> None:
    mon = Monitor(StepHost(), NoGpu())
    cuda = {"rank": 0, "t": 100.0, "device": 0, "allocated": 5.0, "reserved": 8,
            "inactive_split": 2, "largest_free": None, "source": "cuda"}
    assert mon.add_rank_samples("p", [PROFILED, cuda]) == 2
    got = msgspec.to_builtins(mon.ranks.since(0))
    assert got[0] == {**PROFILED, "run": "p"}
    assert got[1]["allocated"] == 5 and isinstance(got[1]["allocated"], int)
    assert got[1]["source"] == "cuda" and got[1]["device"] == 0


@pytest.mark.parametrize(("key", "value"), [
    ("source", "<img src=x onerror=alert(1)>"),
    ("source", "CUDA"),
    ("source", 1),
    ("inactive_split", "4096"),
    ("inactive_split", -1),
    ("inactive_split", True),
    ("largest_free", math.nan),
    ("largest_free", math.inf),
    ("largest_free", [1]),
    ("allocated", "<b>1</b>"),
    ("reserved", {"v": 1}),
    ("device", "cuda:0"),
    ("device", 0.5),
    ("rank", "1"),
    ("rank", -1),
    ("rank", False),
    ("t", "now"),
    ("t", math.nan),
])
def test_a_bad_rank_field_refuses_the_whole_batch(key: str, value: object) -> None:
    mon = Monitor(StepHost(), NoGpu())
    with pytest.raises((TypeError, ValueError)):
        mon.add_rank_samples("p", [PROFILED, {**PROFILED, key: value}])
    assert mon.ranks.since(0) == []


def test_a_rank_sample_must_be_an_object_with_a_rank() -> None:
    mon = Monitor(StepHost(), NoGpu())
    for bad in (["rank", 0], "rank 0", {"t": 1.0}):
        with pytest.raises((KeyError, TypeError)):
            mon.add_rank_samples("p", [bad])
    assert mon.ranks.since(0) == []


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
    # the fake's driver has no memory info v2: no figure of the driver's reservation
    assert rows[0]["gpu0_mem_reserved"] == ""


def test_what_the_rank_sink_sends_the_server_keeps() -> None:
    """The two halves of the channel agree: every sample ``RankSink`` queues
    (heartbeats and ``--profile`` memory, odd values included) passes the
    server's checks unchanged."""
    from torchlens.frontends.shared.live_publish import RankSink
    from torchlens.frontends.shared.rank_channel import RankPublisher, ServerInfo

    sink = RankSink("r", publisher=RankPublisher("r", server=ServerInfo("http://x/", "")))
    sink.push(DdpHeartbeat(rank=0, t=1.0, rss=5, cuda_allocated=None))
    sink.push(DdpHeartbeat(rank=1, t=1.0, device="cuda:1", cuda_allocated=3, cuda_reserved=4))
    sink.push_memory(0, {"rss": 9, "allocated": None, "source": "rss"}, 2.0)
    sink.push_memory(1, {k: v for k, v in PROFILED.items() if k not in ("rank", "t")}, 2.0)
    sink.push_memory(1, {"allocated": "x", "largest_free": math.nan, "source": "?"}, 3.0)
    mon = Monitor(StepHost(), NoGpu())
    assert mon.add_rank_samples("r", msgspec.to_builtins(sink._pending)) == 5
    kept = mon.ranks.since(0)
    assert [(r.allocated, r.source) for r in kept] == [
        (5, None), (3, None), (9, "rss"), (1048576, "modelled"), (None, None)]
