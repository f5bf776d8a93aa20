"""A loaded snapshot is a recorded window, not a cell: leaks need
repetition, the time axis comes from the trace, the wording names the window."""

from __future__ import annotations

import pickle

import pytest
from gpumem_fixtures import SNAPSHOTS

from torchlens.frontends.kinds import report_html
from torchlens.frontends.memory.api import load_gpumem
from torchlens.render.memory.report import text_report, timeline_figure

FULLSTEP = SNAPSHOTS / "ctx128_fullstep.pickle"
NO_TIMES = SNAPSHOTS / "ftcourse_older_format.pickle"
needs_snapshots = pytest.mark.skipif(not FULLSTEP.exists(), reason="shared snapshots missing")


def _x_values(fig):
    return [x for r in fig.renderers if type(r.glyph).__name__ == "Step"
            for x in r.data_source.data["x"]]


@needs_snapshots
def test_optimizer_state_of_a_full_step_is_listed_not_flagged():
    r = load_gpumem(str(FULLSTEP))
    a = r.analysis()
    optim = [s for s in a.survivors if "optimizers.py:8" in s.site]
    # exp_avg / exp_avg_sq: made once per parameter (291 times each) and kept
    assert {s.site.rsplit("/", 1)[1] for s in optim} == {"optimizers.py:82", "optimizers.py:84"}
    assert all(s.count == 291 and not s.flagged for s in optim)
    assert r.leaks() == []
    assert "possible leak" not in repr(r)
    assert "possible leaks" not in text_report(r.profile, a)


def _trace(step_sites, steps):
    """A loop: each step allocates a temporary and a kept tensor per site, frees the temporary."""
    trace, addr = [], 1 << 20
    for step in range(steps):
        temps = []
        for line in step_sites:
            frames = [{"filename": "train.py", "line": line, "name": "step"}]
            for keep in (False, True):
                trace.append({"action": "alloc", "addr": addr, "size": 4096, "stream": 0,
                              "frames": frames, "time_us": 1000 * step + line})
                if not keep:
                    temps.append((addr, frames))
                addr += 4096
        for t_addr, frames in temps:
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": t_addr, "size": 4096, "stream": 0,
                              "frames": frames, "time_us": 1000 * step + 900})
    return {"segments": [], "device_traces": [trace]}


def test_a_site_that_frees_and_reallocates_and_keeps_memory_is_flagged(tmp_path):
    path = tmp_path / "loop.pickle"
    path.write_bytes(pickle.dumps(_trace([10, 11], steps=3)))
    rows = load_gpumem(str(path)).leaks()
    assert {r.site for r in rows} == {"train.py:10", "train.py:11"}
    assert all(r.count == 3 and r.passes >= 2 for r in rows)


def test_state_made_once_per_parameter_is_not_flagged(tmp_path):
    # an optimizer's first step: two lines alternate per parameter, nothing is freed
    trace, addr = [], 1 << 20
    for p in range(5):
        for line in (82, 84):
            trace.append({"action": "alloc", "addr": addr, "size": 4096, "stream": 0,
                          "frames": [{"filename": "optim.py", "line": line, "name": "step"}],
                          "time_us": 10 * p + line})
            addr += 4096
    path = tmp_path / "state.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}))
    r = load_gpumem(str(path))
    assert r.leaks() == []
    assert {s.site for s in r.analysis().survivors} == {"optim.py:82", "optim.py:84"}


@needs_snapshots
def test_time_axis_is_ms_from_the_first_event():
    r = load_gpumem(str(FULLSTEP))
    a = r.analysis()
    times = [e.time_us for e in a.trace]
    fig = timeline_figure(a)
    xs = _x_values(fig)
    assert min(xs) == 0 and max(xs) == pytest.approx((max(times) - min(times)) / 1000)
    assert max(xs) > 500  # a 563 ms window, not one vertical line on -1..1
    assert fig.xaxis[0].axis_label == "ms since the first event"


@needs_snapshots
def test_a_trace_without_times_spreads_over_its_entries():
    a = load_gpumem(str(NO_TIMES)).analysis()
    assert all(not e.time_us for e in a.trace)
    fig = timeline_figure(a)
    xs = _x_values(fig)
    assert min(xs) == 0 and max(xs) == len(a.trace) - 1
    assert len(set(xs)) > 1000
    assert "trace entry" in fig.xaxis[0].axis_label


@needs_snapshots
@pytest.mark.parametrize("path", [FULLSTEP, NO_TIMES], ids=lambda p: p.stem)
def test_wording_names_the_recorded_window_not_the_cell(path):
    r = load_gpumem(str(path))
    line = repr(r)
    assert "across the recorded window" in line and "the cell" not in line
    page = report_html(r.profile)
    assert "end of the recorded window" in page and "Memory over the recorded window" in page
    assert "the cell" not in page and "this cell" not in page


def test_a_live_cell_still_says_cell(shell):
    from gpumem_fixtures import CLEAN

    assert shell.run_cell(CLEAN.format(opts="")).success
    assert "across the cell" in repr(shell.user_ns["r"])
