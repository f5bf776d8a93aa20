"""A DDP loop for ``torchlens run`` tests (CPU, gloo) in which every rank leaks:
each step keeps a ``TL_KEEP_MIB`` MiB tensor (default 4) in a list, as a loop
that appends its loss with its graph does. ``TL_STEPS`` steps (default 150)."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import torchlens

STEPS = int(os.environ.get("TL_STEPS", "150"))
KEEP = int(float(os.environ.get("TL_KEEP_MIB", "4")) * (1 << 20)) // 4


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for _ in range(STEPS):
        x, y = torch.randn(8, 16), torch.randn(8, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        kept.append(torch.full((KEEP,), loss.item()))  # written: its pages are in use
        torchlens.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
