"""``%%torchprof`` / ``torchlens.torchprof()`` on a CUDA model: kernels, device time, FLOP/s."""

from __future__ import annotations

from pathlib import Path

import torch

import torchlens


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda()
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _train(model, opt, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(256, 1024, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torchlens.step()


def test_kernels_device_time_and_flops(artifacts: Path, figures: dict) -> None:
    model, opt = _model()
    _train(model, opt, 2)  # warm-up: cuBLAS handles, allocator
    torch.cuda.synchronize()
    with torchlens.torchprof(flops=True, shapes=True) as r:
        _train(model, opt, 5)
        torch.cuda.synchronize()
    summary = r.analysis().summary
    assert summary.gpu_present and summary.n_kernels > 0, summary
    kernels = r.kernels()
    assert len(kernels) > 0 and (kernels["total_us"] > 0).all()
    streams = {s for ss in kernels["streams"] for s in str(ss).split(",") if s}
    assert streams and (kernels["streams"].astype(str).str.len() > 0).all()  # "7,40"
    ops = r.ops()
    mm = ops[ops["name"].isin(["aten::addmm", "aten::mm"])]
    assert len(mm) and (mm["device_us"] > 0).all(), ops.head(20)
    row = mm.sort_values("flops", ascending=False).iloc[0]
    assert row["flops"] > 0
    # FLOP/s is on device time: the work the GPU did over the time the GPU took
    assert abs(row["flops_per_s"] - row["flops"] / (row["device_us"] * 1e-6)) <= 0.01 * row["flops_per_s"]
    steps = r.steps()
    assert len(steps) >= 4, steps
    assert (steps["kernel_us"] > 0).all(), steps  # the step breakdown's GPU columns
    r.export(str(artifacts / "cuda_torchprof.json.gz"))  # the Kineto JSON, as torch wrote it
    r.save(str(artifacts / "cuda_torchprof.tlprof"))  # with the FLOPs torch left out of it
    html = artifacts / "cuda_torchprof.html"
    r.export(str(html))
    text = html.read_text(encoding="utf-8")
    assert "kernel" in text.lower()
    figures.update(kernels=len(kernels), device_us=float(kernels["total_us"].sum()),
                   top_mm_tflops=float(row["flops_per_s"]) / 1e12,
                   streams=sorted(streams))


def test_magic_cell_on_cuda(figures: dict) -> None:
    """The magic itself, in an IPython shell, on a CUDA cell."""
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.clear_instance()
    ip = InteractiveShell.instance()
    try:
        assert ip.run_cell("%load_ext torchlens").success
        ip.user_ns["torch"] = torch
        cell = ("%%torchprof --top 5 -o prof\n"
                "a = torch.randn(2048, 2048, device='cuda')\n"
                "for _ in range(3):\n    b = a @ a\n"
                "torch.cuda.synchronize()\n")
        res = ip.run_cell(cell)
        assert res.success, res.error_in_exec
        result = ip.user_ns["prof"]
        assert result.analysis().summary.gpu_present
        mm = result.ops()
        assert mm[mm["name"] == "aten::mm"]["device_us"].sum() > 0
        figures.update(mm_device_us=float(mm[mm["name"] == "aten::mm"]["device_us"].sum()))
    finally:
        InteractiveShell.clear_instance()
