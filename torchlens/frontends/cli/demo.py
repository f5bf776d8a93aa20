"""``torchlens demo``: profile a small model's training and write a report.

It shows a new user, on any machine (CPU is enough), what a report looks like:
a few training steps of a small MLP with a DataLoader, marked with
``torchlens.step()`` so the per-step breakdown appears.
"""

from __future__ import annotations

from typing import Any

from torchlens.frontends.result import Result
from torchlens.frontends.trace.api import torchprof


def train_steps(steps: int = 8, batch: int = 64, width: int = 256) -> Any:
    """Build a small MLP and return a function that runs ``steps`` training steps."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(steps * batch, width),
                         torch.randint(0, 10, (steps * batch,)))
    loader = DataLoader(data, batch_size=batch)

    def run() -> float:
        import torchlens

        loss = torch.zeros(())
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            torchlens.step()
        return float(loss.detach())

    return run


def run_demo(output: str, steps: int = 8) -> Result:
    """Profile ``steps`` training steps and write the report to ``output``."""
    run = train_steps(steps)
    run()  # warm-up: the first profiled run of a process is much slower
    with torchprof(shapes=True, memory=True, flops=True, export=output,
                   title="torchlens demo: small MLP training") as result:
        run()
    return result
