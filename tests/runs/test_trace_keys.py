"""Per-step traces meet by their step, not their position: a rank whose step-4
trace is unreadable still has its step 9 meet the others' step 9 (a new-user
walk cut one trace of a run folder and got 'rank 0 arrived last, others
waited 2,167 ms' from step 9 set against step 4)."""

from __future__ import annotations

import msgspec

from torchlens.analysis.runs.collectives import collective_rows
from torchlens.model.run_figures import TraceFigures


def _figures(step: int, t0: float, trace: int) -> TraceFigures:
    table = {"names": ["allreduce"], "name": [0], "t0": [t0], "dur_us": [100.0],
             "bytes": [4096], "kernel_us": [None], "kernel_start_us": [None], "group": [2],
             "pg": [None]}  # collective_table's columns, as a worker sends them
    return msgspec.convert({"trace": trace, "steps": [{"step": step}], "collectives": table},
                           TraceFigures)


def test_steps_meet_their_own_step_when_a_rank_lost_one_trace() -> None:
    base = 1_800_000_000.0
    ranks = {
        # rank 0's step-4 trace was unreadable: its step 9 is its first trace
        0: [_figures(9, base + 9.0, 0), _figures(43, base + 43.0, 1)],
        1: [_figures(4, base + 4.0, 0), _figures(9, base + 9.001, 1), _figures(43, base + 43.001, 2)],
    }
    rows = collective_rows(ranks, world_size=2)
    by_step = {r.step: r for r in rows}
    assert set(by_step) == {4, 9, 43}
    assert by_step[4].ranks == 1  # only rank 1 has step 4: nothing compared
    for step in (9, 43):
        row = by_step[step]
        assert row.ranks == 2 and row.last_rank == 1
        assert row.max_wait_us < 2_000  # 1 ms apart, not 5 s (step 9 against step 4)
