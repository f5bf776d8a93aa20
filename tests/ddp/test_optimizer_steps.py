"""Steps found from the job's optimizer when the code never calls ``torchlens.step()``
(``capture.ranks.autostep``): in one process, and under ``%ddp_check --profile``."""

from __future__ import annotations

import pytest
import torch

import torchlens
from torchlens.capture.ranks.stepper import RankProfiler
from torchlens.frontends.ddp.api import ddp_check

from . import profiled
from .conftest import assert_clean


def _train(tmp_path, iterations: int, optimizers: int = 1, mark: bool = False):
    """A loop of ``iterations`` under a started RankProfiler; its step records and words."""
    prof = RankProfiler(rank=0, run_dir=str(tmp_path), device=None, every=10_000)
    prof.start()
    try:
        torch.manual_seed(0)
        models = [torch.nn.Linear(8, 1) for _ in range(optimizers)]
        opts = [torch.optim.Adam(m.parameters(), lr=0.01) for m in models]
        for _ in range(iterations):
            for m, opt in zip(models, opts, strict=True):
                opt.zero_grad()
                m(torch.randn(4, 8)).sum().backward()
                opt.step()
            if mark:
                torchlens.step()
    finally:
        prof.finish(wait_s=1.0)
    records, _ = prof.drain()
    # a loaded machine's first step can come after the first fixed window (5 s):
    # that window was set-up (``_windows_were_set_up``) and comes first, marked
    windows = [r for r in records if r.window]
    assert records[:len(windows)] == windows
    return records[len(windows):], prof.status().steps_by


def test_each_optimizer_step_ends_a_step_and_the_view_is_told_so(tmp_path):
    records, by = _train(tmp_path, 5)
    assert [r.step for r in records] == [0, 1, 2, 3, 4]
    assert not any(r.window for r in records)
    assert by == "optimizer.step() of Adam"
    # the step holds its own backward and optimizer time, not the next one's (step
    # 0's can have gone into a set-up window cut in its middle on a loaded machine)
    assert all(r.phases["backward"] > 0 and r.phases["optimizer"] > 0 for r in records[1:])


def test_torchlens_step_after_the_optimizer_wins_and_nothing_counts_twice(tmp_path):
    records, by = _train(tmp_path, 5, mark=True)
    assert [r.step for r in records] == [0, 1, 2, 3, 4]
    assert by == "torchlens.step()"


def test_two_optimizers_stepping_in_one_iteration_count_one_step(tmp_path):
    records, by = _train(tmp_path, 4, optimizers=2)
    assert len(records) == 4
    assert by == "optimizer.step() of Adam"


def test_ddp_check_profile_without_torchlens_step_gets_optimizer_steps(tmp_path):
    res = ddp_check(profiled.unmarked, profile=True, run_dir=str(tmp_path / "run"),
                    world_size=2, backend="gloo", live=False, profile_every=4)
    prof = res.records.profiling
    assert res.records.outcome == "finished"
    assert not prof.windows
    assert [len(s) for s in prof.steps] == [8, 8]
    assert not any(r.window for s in prof.steps for r in s)
    assert prof.steps_by == "optimizer.step() of SGD"
    assert "steps end at each optimizer.step() of SGD" in res._repr_mimebundle_()["text/html"]
    assert_clean(res)


@pytest.mark.usefixtures("no_leftovers")
def test_a_function_with_no_optimizer_keeps_fixed_windows_and_says_so(tmp_path):
    res = ddp_check(profiled.no_steps, profile=True, run_dir=str(tmp_path / "run"),
                    world_size=2, backend="gloo", live=False, profile_window=0.2,
                    profile_every=2)
    prof = res.records.profiling
    assert prof.windows
    assert prof.steps_by.startswith("fixed 0.2 s windows")
    assert_clean(res)
