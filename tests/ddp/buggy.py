"""One deliberately buggy step per check, and a correct DDP step.

conftest registers this module with cloudpickle by value, so the functions
travel to the workers the way notebook functions (which live in __main__) do.
Each function is called as fn(rank, world_size).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def _ddp_step(rank: int) -> DDP:
    model = DDP(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 8) + rank  # each rank its own data, as in real training
    model(x).pow(2).mean().backward()
    opt.step()
    return model


def correct_step(rank, world_size):
    return _ddp_step(rank).module


def all_reduce_once(rank, world_size):
    """Correct and quick: one all_reduce, no DDP (so no torch._dynamo import)."""
    dist.all_reduce(torch.ones(4))


def op_mismatch(rank, world_size):
    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


def shape_mismatch(rank, world_size):
    dist.all_reduce(torch.ones(4 if rank == 0 else 5))


def dtype_mismatch(rank, world_size):
    dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64))


def skips_collective(rank, world_size):
    if rank == 0:  # rank 1 skips this all_reduce
        dist.all_reduce(torch.ones(4))
    dist.broadcast(torch.ones(2), src=0)


def hangs(rank, world_size):
    if rank == 1:
        time.sleep(600)  # e.g. a data loader stuck on one rank
    dist.all_reduce(torch.ones(4))


def drifts(rank, world_size):
    model = _ddp_step(rank)
    if rank == 1:  # a rank-dependent in-place update DDP cannot see
        with torch.no_grad():
            model.module.weight.add_(0.5)
    return model.module


def nondeterministic(rank, world_size):
    """Adds noise from os.urandom: no seed controls it, so two seeded runs differ.

    (torch.randn without a seed would not do: the check seeds every run.)
    """
    model = DDP(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    noise = torch.frombuffer(bytearray(os.urandom(16 * 8)), dtype=torch.uint8)
    x = torch.randn(16, 8) + noise.reshape(16, 8).float() / 255
    model(x).pow(2).mean().backward()
    opt.step()
    return model.module


def raises(rank, world_size):
    if rank == 1:
        raise ValueError("bad batch on rank 1")
    dist.all_reduce(torch.ones(4))


def inconsistent_env(rank, world_size):
    if rank == 1:
        os.environ["MASTER_PORT"] = "29501"  # e.g. a hard-coded launcher setting
    dist.all_reduce(torch.ones(4))


def stops_early(rank, world_size):
    dist.all_reduce(torch.ones(4))
    if rank == 0:
        dist.all_reduce(torch.ones(4))  # rank 1 returns without this one


def last_rank_diverges(rank, world_size):
    t = torch.ones(4)
    dist.all_reduce(t)  # every rank agrees on #0
    if rank == world_size - 1:
        dist.broadcast(t, src=0)  # the last rank alone broadcasts at #1
    else:
        dist.all_reduce(t)


def one_rank_skips(rank, world_size):
    t = torch.ones(4)
    if rank != 1:  # rank 1 alone skips this all_reduce
        dist.all_reduce(t)
    dist.all_reduce(t)  # gloo pairs rank 1's with the others' skipped one
    dist.broadcast(t, src=0)


def skips_lookalike(rank, world_size):
    """A skip the sequences show: rank 1's first all_reduce is rank 0's second."""
    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t)  # rank 1 skips this all_reduce
    dist.all_reduce(t)  # gloo pairs rank 1's with rank 0's skipped one
    dist.broadcast(t, src=0)


def gathers_and_scatters(rank, world_size):
    """Correct: the tensor forms of all_gather and reduce_scatter (c10d calls
    them _allgather_base / _reduce_scatter_base, behind deprecation wrappers)."""
    out = torch.empty(4 * world_size)
    dist.all_gather_into_tensor(out, torch.ones(4))  # gathered here
    dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world_size))  # scattered here


def gather_or_scatter(rank, world_size):
    if rank == 0:
        dist.all_gather_into_tensor(torch.empty(4 * world_size), torch.ones(4))  # rank 0
    else:
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4 * world_size))  # rank 1


def prints_environment(rank, world_size):
    """Correct, but logs its whole environment (as a debugging user does), then
    runs 40 all_reduces over about 2 s so a test can look at the processes (a
    count, not a deadline: every rank issues as many)."""
    print(sorted(os.environ.items()), flush=True)
    for _ in range(40):
        dist.all_reduce(torch.ones(4))
        time.sleep(0.05)
