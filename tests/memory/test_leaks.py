"""Leak grouping and per-run growth on hand-made traces (pure analysis, no torch)."""

from __future__ import annotations

from torchlens.analysis.frames import is_user_frame, site_of
from torchlens.analysis.memory.leaks import (
    growth_per_run,
    possible_leaks,
    steady_growth,
    survivors,
)
from torchlens.analysis.memory.timeline import build_timeline
from torchlens.model.snapshot import Frame, TraceEntry

CELL = "<ipython-input-7-0123abcd>"


def _frames(line: int) -> list[Frame]:
    return [Frame("/x/site-packages/torch/nn/functional.py", "linear", 1),
            Frame("RegisterCPU.cpp", "at::addmm", 0),
            Frame(CELL, "<module>", line)]


def _alloc(addr, size, t, line):
    return TraceEntry("alloc", addr, size, time_us=t, frames=_frames(line))


def _free(addr, size, t):
    return TraceEntry("free_completed", addr, size, time_us=t)


def test_user_frames_skip_torch_cpp_and_ipython():
    assert site_of(_frames(3)) == ("cell [7] line 3", "<module>")
    assert not is_user_frame(Frame("/usr/lib/python3.11/threading.py", line=1))
    assert not is_user_frame(Frame("<frozen runpy>", line=1))
    assert is_user_frame(Frame("/tmp/ipykernel_12/345.py", line=2))


def test_loop_that_keeps_each_step_is_flagged_and_one_that_does_not_is_not():
    leaky, clean, t = [], [], 0
    for i in range(4):
        leaky += [_alloc(100 + i, 1000, t, 2), _alloc(200 + i, 8, t + 1, 3)]
        # the clean loop frees the previous step's tensors when the names are rebound
        clean += [_alloc(100 + i, 1000, t, 2), _alloc(200 + i, 8, t + 1, 3)]
        if i:
            clean += [_free(100 + i - 1, 1000, t + 2), _free(200 + i - 1, 8, t + 2)]
        t += 10
    rows = possible_leaks(build_timeline(leaky))
    assert [(r.site, r.bytes, r.passes) for r in rows] == [
        ("cell [7] line 2", 4000, 4), ("cell [7] line 3", 32, 4)]
    assert possible_leaks(build_timeline(clean)) == []
    alive = survivors(build_timeline(clean))
    assert {r.site for r in alive} == {"cell [7] line 2", "cell [7] line 3"}


def test_model_built_in_one_line_is_listed_not_flagged():
    trace = [_alloc(a, 4096, a, 1) for a in range(1, 5)]
    rows = survivors(build_timeline(trace))
    assert rows[0].count == 4 and rows[0].passes == 1 and not rows[0].flagged


def test_growth_per_run():
    trace, runs = [], []
    for run in range(3):
        t = run * 100
        trace += [_alloc(10 + run, 500, t + 1, 2), _alloc(50 + run, 64, t + 2, 3),
                  _free(50 + run, 64, t + 3)]
        runs.append((t, t + 50))
    growth = growth_per_run(build_timeline(trace), runs)
    assert [g.growth for g in growth] == [500, 500, 500]
    assert steady_growth(growth) == 500
