"""A CUDA graph replay and a ``torch.compile`` call under the per-step profiler."""

from __future__ import annotations

import torch

import torchlens


def test_graph_replay_and_compile_under_schedule(figures: dict) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256)).cuda()
    static_x = torch.randn(64, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = model(static_x)
    compiled = torch.compile(lambda t: torch.nn.functional.gelu(t) * 2)
    compiled(static_x)  # compile outside the capture
    with torchlens.torchprof(schedule=(1, 1, 3)) as r:
        for _ in range(6):
            static_x.copy_(torch.randn(64, 256, device="cuda"))
            graph.replay()
            compiled(static_y)
            torch.cuda.synchronize()
            torchlens.step()
    summary = r.analysis().summary
    figures.update(kernels=summary.n_kernels, gpu=summary.gpu_present,
                   steps=len(r.steps()))
    assert summary.gpu_present and summary.n_kernels > 0
    assert len(r.steps()) >= 1
    names = set(r.kernels()["name"])
    assert names, "no kernels recorded"
