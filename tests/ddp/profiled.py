"""Training loops for ``%ddp_check --profile`` tests: each calls ``torchlens.step()``.

conftest registers this module with cloudpickle by value (like ``buggy``), so
the functions travel to the ranks as notebook functions do. Each runs as
fn(rank, world_size, steps=N).
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torchlens


class Batches(torch.utils.data.Dataset):
    """Synthetic samples; ``sleep_s`` per sample makes a slow input pipeline."""

    def __init__(self, sleep_s: float = 0.0) -> None:
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.randint(0, 4, (), generator=g)


def _loop(rank: int, steps: int, data_sleep_s: float = 0.0, grow_bytes: int = 0,
          fail_at: int | None = None, kill_at: int | None = None,
          mark: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Batches(data_sleep_s), batch_size=4)
    kept = []
    for i, (x, y) in enumerate(loader):
        if i >= steps:
            break
        if fail_at is not None and i == fail_at:
            raise RuntimeError(f"rank {rank} failed on purpose at step {i}")
        if kill_at is not None and i == kill_at:  # as the out-of-memory killer would
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if grow_bytes:
            kept.append(torch.ones(grow_bytes // 4))  # a leak: one more buffer per step
        if mark:
            torchlens.step()
    return model.module


def straggler(rank, world_size, steps=20):
    """Rank 2 (or the last rank, with fewer ranks) waits 20 ms per batch for data (4 x 5 ms)."""
    slow = min(2, world_size - 1)
    return _loop(rank, steps, data_sleep_s=0.005 if rank == slow else 0.0)


def creeping(rank, world_size, steps=24):
    """Rank 1 keeps 2 MiB more every step."""
    return _loop(rank, steps, grow_bytes=(2 << 20) if rank == 1 else 0)


def crashing(rank, world_size, steps=20):
    """Rank 1 raises at step 6; the others block in the next all_reduce."""
    return _loop(rank, steps, fail_at=6 if rank == 1 else None)


def killed(rank, world_size, steps=12):
    """Rank 1 dies of SIGKILL at step 4: no result, no traceback."""
    return _loop(rank, steps, kill_at=4 if rank == 1 else None)


def balanced(rank, world_size, steps=12):
    return _loop(rank, steps)


def unmarked(rank, world_size, steps=8):
    """The straggler's loop without torchlens.step(): only its optimizer marks the steps."""
    return _loop(rank, steps, data_sleep_s=0.005 if rank == world_size - 1 else 0.0, mark=False)


def no_steps(rank, world_size):
    """Never calls torchlens.step(): about 1.5 s of all_reduces and matmuls."""
    t = torch.ones(256, 256)
    for _ in range(150):  # a count, not a deadline: every rank issues as many all_reduces
        time.sleep(0.01)
        t = torch.tanh(t @ t / 256)
        dist.all_reduce(t)
        t /= world_size


def huge_steps(rank, world_size, steps=4):
    """Each step runs 150k tiny ops (about 300k profiler events when profiled)."""
    x = torch.zeros(1)
    t = torch.ones(4)
    for _ in range(steps):
        for _ in range(150_000):
            x.add_(1)
        dist.all_reduce(t)
        torchlens.step()



def plain_loop(rank, world_size, steps=8):
    """No DDP (as FSDP's or a hand-written loop's modules are not DDP's): gradients
    averaged by hand; returns the model after its ``steps``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.ones(4, 8)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size
        opt.step()
        opt.zero_grad()
        torchlens.step()
    return model


def plain_fixed(rank, world_size):
    """``plain_loop``'s own 8 steps whatever --steps says (no ``steps`` parameter)."""
    return plain_loop(rank, world_size, 8)
