"""A ``%%torchprof --flops`` cell recorded on a real GPU by ``scripts/gpu-check``
(tests/data/cuda): kernels, their stream, device time and the step breakdown
from the Kineto trace as torch wrote it (``.json.gz``), and FLOP/s on device
time from the saved result (``.tlprof``; torch's JSON holds no FLOPs), read on
a CPU-only machine."""

from __future__ import annotations

from pathlib import Path

from torchlens.analysis.trace.analyze import TraceView
from torchlens.formats.kineto import load_trace
from torchlens.frontends.result import Result
from torchlens.model import load_profile
from torchlens.model.payloads import OpDisplay

DATA = Path(__file__).resolve().parents[1] / "data" / "cuda"
TRACE = DATA / "cuda_torchprof.json.gz"


def test_gpu_trace_tables() -> None:
    view = TraceView("main", load_trace(TRACE), OpDisplay())
    assert view.has_gpu
    kernels = view.kernels
    assert len(kernels) > 0 and (kernels["total_us"] > 0).all()
    assert all(str(s) for s in kernels["streams"])
    ops = view.ops
    mm = ops[ops["name"] == "aten::addmm"]
    assert len(mm) and (mm["device_us"] > 0).all()
    steps = view.steps
    # the cell ran 5 steps; the JSON alone cannot tell the code after the last
    # step() (torch's ProfilerStep#5) from a step, so a 6th, kernel-less row may follow
    assert len(steps) in (5, 6) and (steps["kernel_us"][:5] > 0).all()


def test_flops_per_second_on_device_time() -> None:
    result = Result(load_profile(DATA / "cuda_torchprof.tlprof"))
    ops = result.ops()
    mm = ops[ops["name"].isin(["aten::addmm", "aten::mm"]) & (ops["flops"] > 0)]
    assert len(mm)
    for _, row in mm.iterrows():
        assert abs(row["flops_per_s"] - row["flops"] / (row["device_us"] * 1e-6)) <= 1e-9 * row["flops_per_s"]
