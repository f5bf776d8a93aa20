"""``torchlens.load(TRACE).ops()``: the README's ``result.ops()`` on a loaded trace.

A loaded trace is a run (``RunResult``), which inherited ``ops()`` and ``hints()``
from the one-trace result and raised ``this result has no trace: `` (nothing after
the colon) for both."""

from __future__ import annotations

import gzip
import json
import pickle
from collections import defaultdict

import pytest

import torchlens
from torchlens.model import InputError


def _raw(path) -> dict[tuple[str, str], list[float]]:
    """Count and summed duration per (category, name) of the trace's complete events."""
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for e in json.load(gzip.open(path))["traceEvents"]:
        if e.get("ph") == "X" and "dur" in e:
            acc = out[(e.get("cat"), e.get("name"))]
            acc[0] += 1
            acc[1] += float(e["dur"])
    return out


def test_a_loaded_trace_has_an_op_table_with_its_kernels_and_ops(traces_dir):
    path = traces_dir / "a100_simple_add.json.gz"  # no ProfilerStep spans: the whole trace
    ops = torchlens.load(str(path)).ops()
    raw = _raw(path)
    assert set(ops["rank"]) == {0} and set(ops["steps"]) == {0}
    for kind in ("kernel", "cpu_op", "gpu_memcpy"):
        got = ops[ops["kind"] == kind]
        expected = {n: v for (c, n), v in raw.items() if c == kind}
        assert len(got) == len(expected) > 0
        for row in got.itertuples():
            assert row.count == expected[row.name][0]
            assert row.total_us == pytest.approx(expected[row.name][1], rel=1e-9)
    # the most time first
    assert list(ops["total_us"]) == sorted(ops["total_us"], reverse=True)


def test_per_step_figures_inside_the_profiler_steps(traces_dir):
    ops = torchlens.load(str(traces_dir / "cpu_only_gloo_rank34.json.gz")).ops()
    row = ops.set_index("name").loc["gloo:all_reduce"]
    assert (row["rank"], row["steps"]) == (34, 1)
    assert row["us_per_step"] == row["total_us"] > 0


def test_hints_are_the_findings_and_a_trace_less_result_says_why(traces_dir, tmp_path):
    run = torchlens.load(str(traces_dir / "a100_simple_add.json.gz"))
    assert run.hints() == run.findings()
    snap = tmp_path / "s.pickle"  # a memory result: no trace, and nothing "unmeasured"
    snap.write_bytes(pickle.dumps({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1,
         "frames": []}]]}))
    with pytest.raises(InputError, match=r"no trace: a gpumem result holds none$"):
        torchlens.load(str(snap)).ops()
