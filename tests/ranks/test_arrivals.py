"""``analysis.ranks.arrivals``: matching one step's collectives across ranks by ``seq``."""

from __future__ import annotations

import pytest

from torchlens.analysis.ranks.arrivals import CollectiveArrival, collective_arrivals
from torchlens.model.records import StepSummary


def summary(*colls: tuple[int, float, int]) -> StepSummary:
    return StepSummary.of({"step": 0, "t0": 0.0, "collectives": [{"name": f"allreduce{seq}", "seq": seq, "t0": t0,
                                            "dur": 0.01, "lane": lane}
                                           for seq, t0, lane in colls]})


def colls(*items: dict) -> StepSummary:
    return StepSummary.of({"step": 0, "t0": 0.0, "collectives": [{"name": "", "dur": 0.0, **c} for c in items]})


def test_the_latest_entry_of_each_seq_is_the_last_arrival() -> None:
    rows = collective_arrivals({
        0: summary((0, 10.00, 0), (1, 10.50, 1)),
        1: summary((0, 10.03, 2), (1, 10.51, 0)),
        2: summary((0, 10.01, 0)),  # seq 1 never issued on rank 2
    })
    assert [r.seq for r in rows] == [0, 1]
    first, second = rows
    assert first.ranks == [0, 1, 2] and first.lanes == [0, 2, 0]
    assert first.last_rank == 1 and first.last_arrival == 10.03
    assert first.arrived_by == "host" and first.issued == first.arrivals
    assert first.spread_ms == pytest.approx(30.0)
    assert first.name == "allreduce0"
    assert second.ranks == [0, 1] and second.last_rank == 1
    assert second.spread_ms == pytest.approx(10.0)


def test_one_rank_and_a_summary_without_collectives() -> None:
    rows = collective_arrivals({3: colls({"seq": 0, "t0": 1.0}), 4: StepSummary(step=0, t0=0.0)})
    assert rows == [CollectiveArrival(seq=0, name="", ranks=[3], arrivals=[1.0],
                                      arrived_by="host", issued=[1.0], lanes=[0],
                                      last_rank=3, last_arrival=1.0, spread_ms=0.0)]


def test_a_tie_goes_to_the_lower_rank_as_in_a_multi_rank_run() -> None:
    """One rule (``last_arrival``) for the live view and ``analysis.runs.collectives``."""
    rows = collective_arrivals({0: summary((0, 5.0, 0)), 1: summary((0, 5.0, 0))})
    assert rows[0].last_rank == 0


def test_with_nccl_kernels_the_rank_whose_gpu_got_there_last_arrived_last() -> None:
    """NCCL: rank 0's host issues last but its GPU is idle, so its kernel starts
    at once; rank 1's host issued first while its GPU was still 20 ms behind."""
    rows = collective_arrivals({
        0: colls({"seq": 0, "name": "allreduce", "t0": 10.005, "k0": 10.006}),
        1: colls({"seq": 0, "name": "allreduce", "t0": 10.000, "k0": 10.026}),
    })
    (row,) = rows
    assert (row.arrived_by, row.last_rank) == ("kernel", 1)
    assert row.arrivals == [10.006, 10.026] and row.issued == [10.005, 10.000]
    assert row.spread_ms == pytest.approx(20.0)


def test_kernel_starts_count_only_when_every_rank_has_one() -> None:
    """A kernel start and a host issue do not compare: one way for all ranks."""
    rows = collective_arrivals({
        0: colls({"seq": 0, "t0": 10.005, "k0": 10.006}),
        1: colls({"seq": 0, "t0": 10.000}),  # its kernel fell outside the trace
    })
    assert rows[0].arrived_by == "host" and rows[0].last_rank == 0
