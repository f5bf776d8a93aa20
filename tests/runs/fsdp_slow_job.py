"""A new user's FSDP2 job (``fsdp_slow.py``), copied: four
``fully_shard`` Linear layers under a ``fully_shard`` root, Adam, 60 steps,
rank 1's DataLoader collate sleeping 30 ms a batch. It never imports torchlens.
``TL_EVEN=1``: no rank sleeps (the even run); ``TL_SLOW_S``: the sleep (default 0.03).
``TL_FSDP1=1``: the same layers wrapped by FSDP1 (``FullyShardedDataParallel``)."""
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

SLOW = -1 if os.environ.get("TL_EVEN") == "1" else 1
SLOW_S = float(os.environ.get("TL_SLOW_S", "0.03"))
FSDP1 = os.environ.get("TL_FSDP1") == "1"


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(64, 64) for _ in range(4)])
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x):
        for l in self.layers: x = torch.relu(l(x))  # noqa: E701, E741
        return self.head(x)


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = Net()
    if FSDP1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        cpu = torch.device("cpu")
        model.layers = torch.nn.ModuleList(FSDP(l, device_id=cpu, use_orig_params=True)
                                           for l in model.layers)  # noqa: E741
        model = FSDP(model, device_id=cpu, use_orig_params=True)
    else:
        for l in model.layers: fully_shard(l)  # noqa: E701, E741
        fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ds = [(torch.randn(64), torch.randint(0, 4, ()).item()) for _ in range(16 * 60)]

    def collate(b):
        if dist.get_rank() == SLOW: time.sleep(SLOW_S)  # noqa: E701
        return torch.stack([t[0] for t in b]), torch.tensor([t[1] for t in b])
    it = iter(torch.utils.data.DataLoader(ds, batch_size=16, collate_fn=collate))
    for _step in range(60):
        x, y = next(it)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
