"""A DDP training loop that never imports torchlens (CPU, gloo): ``torchlens run``
must find its ranks and steps by itself.

Rank ``TL_SLOW_RANK`` (default 1) sleeps ``TL_SLOW_S`` in its dataset's
``__getitem__``. ``TL_STEPS`` iterations (default 12), each one
``opt.step()``. ``TL_ALSO_STEP=1``: the loop calls ``torchlens.step()`` after
``opt.step()`` as well (imported then), which must not count twice.
"""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

STEPS = int(os.environ.get("TL_STEPS", "12"))
SLOW_RANK = int(os.environ.get("TL_SLOW_RANK", "1"))
SLOW_S = float(os.environ.get("TL_SLOW_S", "0.05"))
ALSO_STEP = os.environ.get("TL_ALSO_STEP") == "1"


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
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = iter(DataLoader(Batches(rank), batch_size=1))
    for _ in range(STEPS):
        x, y = next(loader)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if ALSO_STEP:
            import torchlens

            torchlens.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
