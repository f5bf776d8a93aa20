"""FSDP jobs for %ddp_check: FSDP2 (``fully_shard``) and FSDP1, on gloo.

Registered with cloudpickle by value in test_fsdp_check, so they travel to
the workers the way notebook functions do. Each is called as fn(rank, world_size).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class Stack(torch.nn.Module):
    """Three equal Linear layers: their FSDP collectives have equal shapes, so
    only the module that issued one tells them apart."""

    def __init__(self, skip: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.skip = skip  # (rank, layer): that rank leaves that layer out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            if self.skip == (dist.get_rank(), i):
                continue
            x = torch.relu(layer(x))
        return x


def _fsdp2(rank: int, skip: tuple[int, int] | None = None, steps: int = 1) -> Stack:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # the same initial weights on every rank
    model = Stack(skip)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x = torch.randn(4, 8) + rank  # each rank its own data
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model


def fsdp2_step(rank, world_size):
    return _fsdp2(rank)


def fsdp2_skips_layer(rank, world_size):
    """Rank 1 leaves layer 1 out of its forward: it never all_gathers layer 1."""
    return _fsdp2(rank, skip=(1, 1))


def fsdp2_loop(rank, world_size, steps=6):
    """The training loop for --profile: steps end at the optimizer's step."""
    return _fsdp2(rank, steps=steps)


def fsdp1_step(rank, world_size):
    return _fsdp1(rank)


def fsdp2_adam(rank, world_size):
    """Adam keeps two moments per parameter: on each rank, of its own shard."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Stack()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 8) + rank).pow(2).mean().backward()
    opt.step()
    return model


def _fsdp1(rank: int, skip: tuple[int, int] | None = None):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    torch.manual_seed(0)
    model = Stack(skip)
    for i, layer in enumerate(model.layers):
        model.layers[i] = FSDP(layer, device_id=torch.device("cpu"))
    model = FSDP(model, device_id=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 8) + rank).pow(2).mean().backward()
    opt.step()
    return model


def fsdp1_skips_layer(rank, world_size):
    """FSDP1: rank 1 leaves layer 1 out of its forward."""
    return _fsdp1(rank, skip=(1, 1))
