"""A small DDP training loop for ``torchlens run`` tests (CPU, gloo).

Rank ``TL_SLOW_RANK`` (default 1) sleeps ``TL_SLOW_S`` in its dataset's
``__getitem__``: a straggler in data loading. ``TL_STEPS`` steps (default 30),
each ending with ``torchlens.step()``. ``TL_STEP_SLEEP`` adds a sleep to every
rank's step (a long run to kill mid-way). ``TL_FAIL_ONCE_AT=N``: rank
``TL_FAIL_RANK`` (default 1) raises in step N of its first start (restart
count 0), so torchrun's agent (``--max-restarts 1``) restarts every worker
and the second start runs to the end. ``TL_HOLD_S`` with ``TL_HOLD_MARK`` (a
path): the other ranks sleep that long at step N, once (the mark file says
it happened), outside any collective: as NCCL ranks hang, not fail, when a
peer dies, so their agent restarts them without counting a failure.
``TL_FAIL_WHEN`` (a path): rank ``TL_FAIL_RANK`` raises at its first step after
the file exists (a test picks the moment).
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import torchlens

STEPS = int(os.environ.get("TL_STEPS", "30"))
SLOW_RANK = int(os.environ.get("TL_SLOW_RANK", "1"))
SLOW_S = float(os.environ.get("TL_SLOW_S", "0.04"))
STEP_SLEEP = float(os.environ.get("TL_STEP_SLEEP", "0"))
FAIL_AT = int(os.environ.get("TL_FAIL_ONCE_AT", "-1"))
FAIL_RANK = int(os.environ.get("TL_FAIL_RANK", "1"))
FIRST_START = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
HOLD_S = float(os.environ.get("TL_HOLD_S", "0"))
HOLD_MARK = os.environ.get("TL_HOLD_MARK", "")
FAIL_WHEN = os.environ.get("TL_FAIL_WHEN", "")


def hold_once() -> None:
    try:
        with open(HOLD_MARK, "x"):
            pass
    except FileExistsError:
        return
    time.sleep(HOLD_S)


class Batches(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        if self.rank == SLOW_RANK:
            time.sleep(SLOW_S)
        return torch.randn(16), torch.randn(1)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = iter(DataLoader(Batches(rank), batch_size=1))
    for i in range(STEPS):
        if i == FAIL_AT and rank == FAIL_RANK and FIRST_START:
            raise RuntimeError(f"rank {rank} fails on purpose at step {i} (TL_FAIL_ONCE_AT)")
        if FAIL_WHEN and rank == FAIL_RANK and os.path.exists(FAIL_WHEN):
            raise RuntimeError(f"rank {rank} fails on purpose at step {i} (TL_FAIL_WHEN)")
        if i == FAIL_AT and rank != FAIL_RANK and HOLD_S and HOLD_MARK:
            hold_once()
        x, y = next(loader)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if STEP_SLEEP:
            time.sleep(STEP_SLEEP)
        torchlens.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
