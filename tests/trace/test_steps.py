"""Step breakdown: hand-computed synthetic trace, a real CPU run, shared traces."""

from __future__ import annotations

import json

import pytest

from torchlens.analysis.trace.steps import STEP_COLUMNS, step_breakdown, step_records
from torchlens.formats.kineto import ingest_bytes, load_trace

ROLE_COLUMNS = STEP_COLUMNS[3:]


def _x(name, ts, dur, cat, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
            "ts": ts, "dur": dur, "args": args}


def _gpu(name, ts, dur, cat, corr, stream=7):
    return _x(name, ts, dur, cat, pid=0, tid=stream, correlation=corr, stream=stream)


def _synthetic_doc():
    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    doc = {"traceEvents": [
        _x("ProfilerStep#1", 0, 100, "user_annotation"),
        _x("ProfilerStep#2", 100, 50, "user_annotation"),
        _x(loader, 0, 10, "user_annotation"),
        _x("aten::mul", 12, 48, "cpu_op"),
        _x("cudaLaunchKernel", 20, 5, "cuda_runtime", correlation=1),
        _gpu("gemm", 30, 100, "kernel", 1),                 # runs past host step 1
        _x("cudaMemcpyAsync", 40, 2, "cuda_runtime", correlation=2),
        _gpu("Memcpy HtoD", 50, 10, "gpu_memcpy", 2),       # hidden under gemm
        _x("cudaLaunchKernel", 110, 5, "cuda_runtime", correlation=3),
        _gpu("ncclDevKernel_AllReduce", 135, 10, "kernel", 3, stream=40),
        _x("cudaMemsetAsync", 116, 1, "cuda_runtime", correlation=4),
        _gpu("Memset (Device)", 146, 2, "gpu_memset", 4),
    ]}
    return doc


def test_synthetic_breakdown_by_hand():
    """Times in µs; the expected numbers are worked out in the comments."""
    doc = _synthetic_doc()
    steps = step_breakdown(ingest_bytes(json.dumps(doc).encode(), "steps.json"))
    assert list(steps.columns) == STEP_COLUMNS
    assert list(steps.step) == [1, 2]
    # step 1 widens to the end of gemm (130); step 2 starts there, ends at 150
    assert list(steps.start_us) == [0, 130]
    assert list(steps.dur_us) == [130, 20]
    one, two = steps.iloc[0], steps.iloc[1]
    # step 1: kernel 30..130 = 100 (memcpy and the runtime calls at 40, 110, 116
    # are under it); runtime 20..25 = 5; dataloader 0..10 = 10; cpu_op 12..20 and
    # 25..30 = 13; nothing busy 10..12 = 2
    assert (one.kernel_us, one.memcpy_us, one.runtime_us) == (100, 0, 5)
    assert (one.dataloader_us, one.cpu_exec_us, one.other_us) == (10, 13, 2)
    assert (one.memset_us, one.comm_us) == (0, 0)
    # step 2 (130..150): nccl 135..145 = 10 (comm), memset 146..148 = 2,
    # idle 130..135, 145..146, 148..150 = 8
    assert (two.comm_us, two.memset_us, two.other_us) == (10, 2, 8)
    assert (two.kernel_us, two.runtime_us, two.cpu_exec_us) == (0, 0, 0)


def test_records_without_pandas_by_hand():
    """``step_records`` (what a run's worker sends): the same hand-worked
    numbers as ``test_synthetic_breakdown_by_hand``, as plain ints and floats."""
    trace = ingest_bytes(json.dumps(_synthetic_doc()).encode(), "steps.json")
    one, two = step_records(trace)
    assert list(one) == STEP_COLUMNS
    assert type(one["step"]) is int and type(one["kernel_us"]) is float
    assert (one["step"], one["start_us"], one["dur_us"]) == (1, 0, 130)
    assert (one["kernel_us"], one["memcpy_us"], one["memset_us"], one["comm_us"]) == (
        100, 0, 0, 0)
    assert (one["runtime_us"], one["dataloader_us"], one["cpu_exec_us"],
            one["other_us"]) == (5, 10, 13, 2)
    assert (two["step"], two["start_us"], two["dur_us"]) == (2, 130, 20)
    assert (two["comm_us"], two["memset_us"], two["other_us"], two["kernel_us"]) == (
        10, 2, 8, 0)


def test_records_of_a_trace_without_steps_are_empty(traces_dir):
    assert step_records(load_trace(traces_dir / "a100_simple_add.json.gz")) == []


def test_no_steps_gives_empty_table_with_columns(traces_dir):
    steps = step_breakdown(load_trace(traces_dir / "a100_simple_add.json.gz"))
    assert steps.empty and list(steps.columns) == STEP_COLUMNS


@pytest.mark.parametrize("name,steps", [
    ("a100_ddp_resnet_rank0_nccl.json.gz", [4, 5, 6]),
    ("v100_ddp_sgd_annotations_rank0.json.gz", [101, 102, 103, 104, 105]),
    ("sampled_rank-0.json.gz", [551, 552]),
    ("amd_mi250_rocm.json.gz", [1, 2]),
    ("no_distributed_info.json.gz", [1009]),
])
def test_real_traces_roles_add_up_to_step_time(traces_dir, plain, name, steps):
    path = traces_dir / name
    trace = load_trace(path)
    table = step_breakdown(trace)
    assert list(table.step) == steps
    assert table[ROLE_COLUMNS].sum(axis=1).to_numpy() == pytest.approx(
        table.dur_us.to_numpy())
    # a step never ends before its host span does (plain json), and starts no
    # earlier (it may start later: where the previous step's GPU work ended)
    t0 = trace.meta["t0_us"]
    host = {int(e["name"].split("#")[1]): (e["ts"] - t0, e["ts"] - t0 + e["dur"])
            for e in plain(path)["traceEvents"]
            if e.get("name", "").startswith("ProfilerStep#")
            and e.get("cat") in ("cpu_op", "user_annotation")}
    for step, start, dur in zip(table.step, table.start_us, table.dur_us, strict=True):
        assert start + dur >= host[step][1] - 1e-3
        assert start >= host[step][0] - 1e-3
    starts, ends = table.start_us.to_numpy(), (table.start_us + table.dur_us).to_numpy()
    assert (starts[1:] >= ends[:-1] - 1e-6).all()  # steps never overlap


def test_a100_ddp_communication_is_reported_apart(traces_dir):
    table = step_breakdown(load_trace(traces_dir / "a100_ddp_resnet_rank0_nccl.json.gz"))
    assert (table.comm_us > 1000).all()
    assert (table.kernel_us > table.comm_us).all()


def test_real_cpu_run_with_schedule_and_dataloader(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule
    from torch.utils.data import DataLoader, TensorDataset

    data = DataLoader(TensorDataset(torch.randn(64, 16), torch.randn(64, 1)),
                      batch_size=8)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / "sched.json"
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(out))) as prof:
        for x, y in data:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    table = step_breakdown(load_trace(out))
    assert len(table) == 3
    assert list(table.step) == list(range(table.step[0], table.step[0] + 3))
    assert (table.dataloader_us > 0).all()
    assert (table.cpu_exec_us > 0).all()
    assert (table[["kernel_us", "memcpy_us", "memset_us", "runtime_us", "comm_us"]]
            == 0).all().all()
    assert table[ROLE_COLUMNS].sum(axis=1).to_numpy() == pytest.approx(
        table.dur_us.to_numpy())
