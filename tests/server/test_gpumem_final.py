"""A finished %%gpumem cell's report figures reach the sidebar.

The sidebar plotted the cell's resident memory (about 424 MiB) beside a report
saying "peak 6.0 MiB allocated". The kernel now posts the report's own series
when the cell ends, and the server passes it on, marked ``final``.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import msgspec
import pytest
import torch
from sampler_doubles import NoGpu, StepHost

import torchlens
from torchlens.frontends.monitor.sampler import Monitor, rank_sample
from torchlens.frontends.shared.live_publish import REPORT_POINTS, report_samples
from torchlens.model.units import format_bytes


@pytest.fixture(scope="module")
def cell():
    started = time.time()
    with torchlens.gpumem(stacks=0) as result:
        kept = [torch.ones(256, 1024) for _ in range(6)]
        del kept[:3]
    return result.analysis(), started, time.time()


def test_the_final_samples_are_the_reports_allocated_series_and_peak(cell) -> None:
    analysis, started, ended = cell
    samples = msgspec.to_builtins(report_samples(analysis, started, ended))  # as posted
    peak = analysis.timeline.peak_allocated
    assert format_bytes(peak) == "6.0 MiB"  # what the report writes
    assert max(s["allocated"] for s in samples) == peak
    assert {s["peak"] for s in samples} == {peak} and all(s["final"] for s in samples)
    assert samples[0]["allocated"] == analysis.timeline.start_allocated
    assert samples[-1]["allocated"] == analysis.timeline.end_allocated
    times = [s["t"] for s in samples]
    assert times == sorted(set(times))  # one value per time, in order
    assert started - 1 <= times[0] and times[-1] <= ended + 1  # the cell's own wall time


def test_a_long_cell_is_sent_in_a_few_hundred_points_keeping_its_peak(cell) -> None:
    analysis, started, ended = cell
    tl = analysis.timeline
    many = type(tl)(t_us=list(range(10_000)), allocated=[i % 977 for i in range(10_000)])
    many.allocated[5_432] = 10**9
    samples = msgspec.to_builtins(report_samples(SimpleNamespace(timeline=many), started, ended))
    assert len(samples) <= REPORT_POINTS + 2
    assert max(s["allocated"] for s in samples) == 10**9


def test_the_server_passes_final_and_peak_and_refuses_a_bad_flag(cell) -> None:
    analysis, started, ended = cell
    mon = Monitor(StepHost(), NoGpu())
    posted = msgspec.to_builtins(report_samples(analysis, started, ended))
    assert mon.add_rank_samples("%%gpumem", posted) > 1
    stored = msgspec.to_builtins(mon.ranks.tail(0)[0])  # as the page gets them
    assert all(s["final"] is True and s["peak"] == analysis.timeline.peak_allocated
               for s in stored)
    live = msgspec.to_builtins(
        rank_sample("x", {"rank": 0, "t": 1.0, "allocated": 5, "source": "rss"}))
    assert "final" not in live and "peak" not in live
    for bad in ({"final": "yes"}, {"final": 1}, {"peak": -1}, {"peak": "6 MiB"}):
        with pytest.raises(ValueError):
            rank_sample("x", {"rank": 0, "t": 1.0, "allocated": 5, **bad})


def test_the_last_sample_is_the_cells_end_when_its_last_instant_held_a_peak(cell) -> None:
    """An allocation and its free in the same microsecond at the end of the cell:
    the instant keeps its highest (the peak shows) and the line still ends on
    the end figure (a fresh clone's CI drew 4 MiB where the report ends at 3 MiB)."""
    analysis, started, ended = cell
    tl = analysis.timeline
    mib = 1 << 20
    last = type(tl)(t_us=[0, 10, 20, 20], allocated=[mib, 3 * mib, 4 * mib, 3 * mib],
                    start_allocated=0, t0_us=tl.t0_us, clock=tl.clock)
    samples = msgspec.to_builtins(report_samples(SimpleNamespace(timeline=last), started, ended))
    assert max(s["allocated"] for s in samples) == 4 * mib
    assert samples[-1]["allocated"] == last.end_allocated == 3 * mib
