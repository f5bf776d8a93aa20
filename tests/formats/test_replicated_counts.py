"""Exact at any size: a trace of N copies of a real one (``benchmarks/
make_big_trace.py``) gives figures that follow from the copies', so none is
lost or double-counted as traces grow. Counts and times are linear in N: the
third copy adds exactly what the second did (the first differs: HTA's window
leaves out each trace's last step, which a following copy brings in). Op
calls and events are N times one copy's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from torchlens.analysis.runs.figures import (
    comm_comp_overlap,
    idle_time,
    kernel_breakdown,
    temporal_breakdown,
)
from torchlens.analysis.trace.ops import kernel_table, op_table
from torchlens.analysis.trace.steps import step_breakdown
from torchlens.formats.kineto import load_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import make_big_trace  # noqa: E402


@pytest.fixture(scope="module")
def traces(traces_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    doc = make_big_trace.load_source(traces_dir / make_big_trace.DEFAULT_SOURCE)
    out = {}
    for n in (1, 2, 3):
        path = tmp_path_factory.mktemp("big") / f"x{n}.json"
        with open(path, "wb") as fh:
            make_big_trace.write(doc, n, fh)
        out[n] = load_trace(path)
    return out


def _figures(trace) -> dict[str, float]:
    t = temporal_breakdown(trace)
    idle = idle_time(trace)
    o = comm_comp_overlap(trace)
    k = kernel_breakdown(trace)
    steps = step_breakdown(trace)
    return {"span_us": t.span_us, "busy_us": t.busy_us, "idle_us": t.idle_us,
            "compute_us": t.compute_us, "non_compute_us": t.non_compute_us,
            "stream_idle_us": sum(s.idle_us for s in idle),
            "stream_events": sum(s.events for s in idle),
            "communication_us": o.communication_us, "overlapped_us": o.overlapped_us,
            "kernel_calls": sum(kind.count for kind in k.kinds.values()),
            "kernel_us": sum(kind.us for kind in k.kinds.values()),
            "steps": len(steps), "step_us": float(steps["dur_us"].sum())}


def test_n_copies_add_exactly_what_one_copy_has(traces) -> None:
    one, two, three = (_figures(traces[n]) for n in (1, 2, 3))
    for name in one:
        added_second, added_third = two[name] - one[name], three[name] - two[name]
        assert added_third == pytest.approx(added_second, rel=1e-9, abs=1e-6), name
    assert three["stream_events"] > two["stream_events"] > one["stream_events"] > 0


def test_events_ops_and_kernels_are_n_times_one_copy(traces) -> None:
    rep = make_big_trace.Replicator(make_big_trace.load_source(
        Path(traces[1].meta["source"])))
    read = {n: len(traces[n].events) + sum((traces[n].meta.get("dropped") or {}).values())
            for n in (1, 2, 3)}
    # every event of every copy is read or counted as dropped: a copy adds all its events
    assert read[3] - read[2] == read[2] - read[1] == rep.per_copy
    ops1 = op_table(traces[1]).set_index("name")["calls"]
    ops3 = op_table(traces[3]).set_index("name")["calls"]
    assert (ops3 == 3 * ops1).all()
    k1, k3 = kernel_table(traces[1]), kernel_table(traces[3])
    assert k3["calls"].sum() == 3 * k1["calls"].sum() > 0
    assert k3["total_us"].sum() == pytest.approx(3 * k1["total_us"].sum(), rel=1e-9)
