"""A plain Accelerate loop that never imports torchlens (CPU, gloo).

Rank ``TL_SLOW_RANK`` (default 1) sleeps ``TL_SLOW_S`` in its dataset's
``__getitem__``. ``TL_STEPS`` iterations (default 12) of
``accelerator.accumulate``: with ``TL_ACCUM`` (default 1) micro-batches per
optimizer step, Accelerate skips the optimizer's step on the others.
"""

import os
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

STEPS = int(os.environ.get("TL_STEPS", "12"))
ACCUM = int(os.environ.get("TL_ACCUM", "1"))
SLOW_RANK = int(os.environ.get("TL_SLOW_RANK", "1"))
SLOW_S = float(os.environ.get("TL_SLOW_S", "0.05"))


class Rows(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        if self.rank == SLOW_RANK:
            time.sleep(SLOW_S)
        return torch.randn(16), torch.randn(1)


def main() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Rows(accelerator.process_index), batch_size=1)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    batches = iter(loader)
    for _ in range(STEPS):
        x, y = next(batches)
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
    accelerator.end_training()


if __name__ == "__main__":
    main()
