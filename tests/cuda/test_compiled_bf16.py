"""Compiled bfloat16 training on CUDA: inductor's regions and compile figures
in ``%%torchprof``'s analysis, ``mode="reduce-overhead"`` (CUDA graphs), and
a float16 ``GradScaler`` whose skipped steps are counted exactly."""

from __future__ import annotations

import torch

import torchlens


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(),
                               torch.nn.Linear(1024, 512)).cuda()


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(torch.randn(64, 512, device="cuda")).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torchlens.step()
    torch.cuda.synchronize()


def test_compiled_bf16_regions_and_compile_time(figures: dict) -> None:
    import torch._dynamo

    torch._dynamo.reset()
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    compiled = torch.compile(model)
    with torchlens.torchprof() as first:  # compiles here
        _train(compiled, opt, 2)
    with torchlens.torchprof() as warm:  # runs what was compiled
        _train(compiled, opt, 5)
    cold, hot = first.compiled(), warm.compiled()
    figures.update(compile_s=cold.compile_s, compiles=cold.compiles, graphs=cold.graphs,
                   breaks=len(cold.breaks), warm_regions=len(hot.regions),
                   warm_region_us=hot.region_us, warm_eager_us=hot.eager_us,
                   warm_kernels=warm.analysis().summary.n_kernels)
    assert cold.compiles >= 1 and cold.compile_s > 0 and not cold.breaks
    assert hot.regions and all(r.function for r in hot.regions)
    assert hot.compiles == 0 and not hot.recompiles
    assert warm.analysis().summary.gpu_present
    ops = warm.ops()
    assert len(ops), "no ops in the warm cell"


def test_reduce_overhead_cuda_graphs(figures: dict) -> None:
    import torch._dynamo

    torch._dynamo.reset()
    model = _model()
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(64, 512, device="cuda")
    with torch.no_grad():
        for _ in range(3):  # warm-up, then the CUDA graph is recorded
            compiled(x)
        torch.cuda.synchronize()
        with torchlens.torchprof() as r:
            for _ in range(5):
                compiled(x)
                torchlens.step()
            torch.cuda.synchronize()
    c = r.compiled()
    summary = r.analysis().summary
    figures.update(regions=len(c.regions) if c else 0, region_us=c.region_us if c else 0,
                   kernels=summary.n_kernels, gpu=summary.gpu_present,
                   recompiles=len(c.recompiles) if c else 0)
    assert c is not None and c.regions, "the CUDA-graph regions were not found"
    assert not c.recompiles
    assert summary.gpu_present


def test_float16_scaler_skips_counted_exactly(figures: dict) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda")
    blow_up = {3, 7, 8}
    with torchlens.torchprof() as r:
        for i in range(12):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(torch.randn(64, 512, device="cuda")).float().mean()
            if i in blow_up:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    s = r.scaler()
    figures.update(steps=s.total_steps, skipped=s.total_skipped, first_scale=s.first_scale,
                   scale=s.scale)
    # float16 may overflow on its own at 65,536; the three made to overflow are counted
    assert s.total_steps == 12 and s.total_skipped >= len(blow_up)
    # each skip halves the scale (no growth within 2,000 steps); the last step
    # used the scale from before its own skip, if it was one
    low = s.first_scale / 2 ** s.total_skipped
    assert low <= s.scale <= 2 * low
    assert any(f.code == "skipped_steps" for f in r.analysis().scaler_findings)
