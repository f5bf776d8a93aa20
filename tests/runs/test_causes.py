"""A straggler's likely cause: the role of its step breakdown that stands out."""

from __future__ import annotations

import pytest

from torchlens.analysis.runs.causes import likely_cause, role_medians, with_causes
from torchlens.analysis.runs.rows import StepRow, StragglerRow


def _steps(rank: int, n: int = 3, dur: float = 50_000.0, **roles: float) -> list[StepRow]:
    base = {"dataloader_us": 300.0, "cpu_exec_us": 2_000.0, "kernel_us": 0.0,
            "memcpy_us": 0.0, "memset_us": 0.0, "runtime_us": 0.0, "comm_us": 0.0,
            "other_us": 40_000.0}
    return [StepRow(rank, i, dur_us=dur + i, **(base | roles)) for i in range(n)]


def test_data_loading_that_stands_out_is_named_with_its_figures():
    rows = _steps(0) + _steps(1) + _steps(2, dataloader_us=20_000.0) + _steps(3)
    cause = likely_cause(2, role_medians(rows))
    assert cause is not None
    assert cause.part == "dataloader" and cause.own_ms == 20.0
    assert cause.others_ms == 0.3 and cause.ratio == pytest.approx(20_000 / 300)


def test_small_or_proportionally_small_excess_is_no_cause():
    # 0.4 ms more data loading: under 0.5 ms and under 5% of a 50 ms step
    rows = _steps(0) + _steps(1, dataloader_us=700.0)
    assert likely_cause(1, role_medians(rows)) is None
    # 3 ms more CPU work, but only 1.1x the others' 30 ms: not a stand-out ratio
    rows = _steps(0, cpu_exec_us=30_000.0) + _steps(1, cpu_exec_us=33_000.0)
    assert likely_cause(1, role_medians(rows)) is None


def test_waiting_roles_are_never_the_cause():
    # the others' wait fills comm/other; a rank that waits less has less there
    rows = _steps(0, comm_us=30_000.0) + _steps(1, other_us=90_000.0)
    assert likely_cause(1, role_medians(rows)) is None
    assert likely_cause(0, role_medians(rows)) is None


def test_the_largest_excess_wins_and_only_late_ranks_get_a_cause():
    rows = (_steps(0) + _steps(1, dataloader_us=5_000.0, kernel_us=30_000.0)
            + _steps(2, kernel_us=10_000.0))
    cause = likely_cause(1, role_medians(rows))
    assert cause is not None and cause.part == "kernel" and cause.others_ms == 5.0
    stragglers = [StragglerRow(0, last=0, caused_us=0.0),
                  StragglerRow(1, last=4, caused_us=9_000.0)]
    out = with_causes(stragglers, rows)
    assert out[0].cause is None and out[1].cause == "kernel"
    assert out[1].wait_per_step_us == 3_000.0
    assert "GPU kernel time took 30.0 ms per step" in str(out[1].cause_words)
