"""``torchlens.load(TRACE).ops()``: the same op table as ``%%torchprof``'s ``result.ops()``.

A loaded trace is a run (``RunResult``). Its op table was once another table
(per kind and name: count and inclusive time, no self or device time); now
both are ``analysis.trace.ops.op_frame`` of the same op sums, the run's made
in its worker processes."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

import torchlens
from torchlens.analysis.trace.ops import (
    OP_COLUMNS,
    OTHER_OPS,
    bounded,
    merged,
    op_sums,
    op_table,
)
from torchlens.formats.kineto import load_trace
from torchlens.model import InputError


def _profiled_steps(steps: int = 3):
    """A small model's training steps under ``torchlens.torchprof`` on the CPU
    (without FLOPs: torch's exported trace leaves them out, see
    ``capture.trace.profiler``)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 32), torch.randint(0, 4, (8,))
    with torchlens.torchprof() as res:
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            torchlens.step()
    return res


def test_torchprof_and_the_saved_trace_loaded_back_give_one_op_table(tmp_path):
    res = _profiled_steps()
    path = res.export(str(tmp_path / "trace.json"))
    here = res.ops()
    run = torchlens.load(path)
    loaded = run.ops()
    # one rank: the torchprof columns, in order, then the run's steps column
    assert list(here.columns) == OP_COLUMNS
    assert list(loaded.columns) == [*OP_COLUMNS, "steps"]
    assert set(loaded["steps"]) == {len(run.steps())} and len(run.steps()) >= 3
    pd.testing.assert_frame_equal(loaded[OP_COLUMNS], here, check_exact=True)
    addmm = loaded.set_index("name").loc["aten::addmm"]
    assert addmm.self_cpu_us > 0 and addmm.total_cpu_us >= addmm.self_cpu_us
    assert addmm.calls == 3 * 2  # two linear layers per forward, three steps


def test_flops_recorded_in_the_file_reach_the_run_table(tmp_path):
    path = Path(_profiled_steps().export(str(tmp_path / "trace.json")))
    doc = json.loads(path.read_text())
    for event in doc["traceEvents"]:
        if event.get("name") == "aten::addmm":
            event.setdefault("args", {})["flops"] = 1000
    path.write_text(json.dumps(doc))
    ops = torchlens.load(str(path)).ops().set_index("name")
    addmm = ops.loc["aten::addmm"]
    assert addmm.flops == 1000 * addmm.calls
    assert addmm.flops_per_s == pytest.approx(addmm.flops / (addmm.total_cpu_us / 1e6))
    assert ops.drop(index="aten::addmm").flops.isna().all()


def test_several_ranks_add_a_rank_column_and_keep_each_ranks_table(traces_dir):
    paths = [traces_dir / f"sampled_rank-{r}.json.gz" for r in (0, 1)]
    ops = torchlens.load([str(p) for p in paths]).ops()
    assert list(ops.columns) == ["rank", *OP_COLUMNS, "steps"]
    assert list(ops["rank"]) == sorted(ops["rank"]) and set(ops["rank"]) == {0, 1}
    for rank, path in enumerate(paths):
        mine = ops[ops["rank"] == rank].reset_index(drop=True)
        pd.testing.assert_frame_equal(mine[OP_COLUMNS], op_table(load_trace(path)),
                                      check_exact=True)


def test_a_gpu_trace_loaded_has_self_and_device_time(traces_dir):
    path = traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz"
    ops = torchlens.load(str(path)).ops()
    pd.testing.assert_frame_equal(ops[OP_COLUMNS], op_table(load_trace(path)),
                                  check_exact=True)
    assert (ops["device_us"] > 0).any() and (ops["kernels"] > 0).any()
    assert (ops["self_cpu_us"] <= ops["total_cpu_us"] + 1e-9).all()
    assert list(ops["total_cpu_us"]) == sorted(ops["total_cpu_us"], reverse=True)


def test_bounded_sums_keep_the_busiest_ops_and_fold_the_rest(traces_dir):
    whole = op_sums(load_trace(traces_dir / "sampled_rank-0.json.gz"))
    kept = bounded(whole, top=5)
    assert len(kept.name) == 6 and kept.name[-1] == OTHER_OPS
    busiest = sorted(whole.total_cpu_us, reverse=True)[:5]
    assert sorted(kept.total_cpu_us[:-1], reverse=True) == busiest
    assert sum(kept.calls) == sum(whole.calls)
    assert sum(kept.kernels) == sum(whole.kernels)
    assert math.fsum(kept.self_cpu_us) == pytest.approx(math.fsum(whole.self_cpu_us))


def test_a_ranks_traces_merge_into_one_table(traces_dir):
    one = op_sums(load_trace(traces_dir / "sampled_rank-0.json.gz"))
    both = merged([one, one])
    assert both.name == one.name and both.steps == 2 * one.steps
    assert both.calls == [2 * c for c in one.calls]
    assert both.total_cpu_us == [2 * us for us in one.total_cpu_us]


def test_tables_only_has_no_op_table(traces_dir):
    run = torchlens.load(str(traces_dir / "a100_simple_add.json.gz"))
    run.tables_only = True
    with pytest.raises(InputError, match="tables_only=True has no op totals"):
        run.ops()


def test_hints_are_the_findings_and_a_trace_less_result_says_why(traces_dir, tmp_path):
    run = torchlens.load(str(traces_dir / "a100_simple_add.json.gz"))
    assert run.hints() == run.findings()
    snap = tmp_path / "s.pickle"  # a memory result: no trace, and nothing "unmeasured"
    snap.write_bytes(pickle.dumps({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1,
         "frames": []}]]}))
    with pytest.raises(InputError, match=r"no trace: a gpumem result holds none$"):
        torchlens.load(str(snap)).ops()
