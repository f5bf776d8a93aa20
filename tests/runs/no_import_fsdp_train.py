"""An FSDP2 (``fully_shard``) training loop that never imports torchlens (CPU,
gloo): ``torchlens run`` must find its per-rank FSDP memory by itself.

Three Linear layers of different sizes, each its own FSDP module (the root
holds no parameter of its own), Adam, ``TL_STEPS`` iterations (default 6).
``TL_PLAIN=1``: the same model without FSDP (replicated, no wrapping).
``TL_FSDP1=1``: FSDP1 (``FullyShardedDataParallel``, each layer and the root
wrapped, ``use_orig_params``) instead of FSDP2.
"""

import os

import torch
import torch.distributed as dist

STEPS = int(os.environ.get("TL_STEPS", "6"))
PLAIN = os.environ.get("TL_PLAIN") == "1"
FSDP1 = os.environ.get("TL_FSDP1") == "1"
#: (in, out) of each layer: every dimension even, so 2 ranks shard it evenly
SIZES = ((4, 8), (8, 4), (4, 2))


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(i, o) for i, o in SIZES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Stack()
    if FSDP1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        cpu = torch.device("cpu")
        model.layers = torch.nn.ModuleList(FSDP(layer, device_id=cpu, use_orig_params=True)
                                           for layer in model.layers)
        model = FSDP(model, device_id=cpu, use_orig_params=True)
    elif not PLAIN:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(STEPS):
        x = torch.randn(4, 4) + rank
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
