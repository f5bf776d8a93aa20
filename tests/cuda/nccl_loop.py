"""A DDP training loop on one CUDA rank with NCCL, calling ``torchlens.step()``.

``train`` is what ``%ddp_check --profile`` runs (registered with cloudpickle by
value in the test); run as a script it is a torchrun job for ``torchlens run``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torchlens


def train(rank: int, world_size: int, steps: int = 12) -> None:
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    if not dist.is_initialized():
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                    torch.nn.Linear(4096, 1024)).to(device),
                device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    flag = torch.ones(1, device=device)
    for _ in range(steps):
        x = torch.randn(512, 1024, device=device)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(flag)  # one NCCL collective outside DDP's buckets too
        torchlens.step()
    torch.cuda.synchronize()


if __name__ == "__main__":
    train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
          int(os.environ.get("TL_STEPS", "24")))
    dist.destroy_process_group()
