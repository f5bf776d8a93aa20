"""A real multi-rank CPU run's traces, one per rank, as torchrun users make them.

Spawns ``--ranks`` gloo ranks of a small DDP model on this machine; each
rank profiles ``--steps`` steps with ``torch.profiler`` and writes its trace
with ``tensorboard_trace_handler`` (``rankR.<pid>.<ms>.pt.trace.json``), so
the folder is what ``torchlens report RUN_DIR`` meets in the wild. Rank
``--slow-rank`` sleeps ``--slow-ms`` in its data loading per step: a
deliberate straggler, which every other rank waits for in DDP's allreduce.

    python benchmarks/make_gloo_run.py OUT --ranks 4 --slow-rank 2

Used by the tests (``tests/runs/test_gloo_run.py``) and to build CPU rank
sets for the benchmarks.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


class _Samples(torch.utils.data.Dataset):
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return 1 << 16

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randint(0, 8, (), generator=g)


def _rank(rank: int, world: int, port: int, out: str, steps: int, slow_rank: int,
          slow_ms: float, base_ms: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                        torch.nn.Linear(256, 8)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        batch = 8
        # the straggler's whole sleep lands in the DataLoader's __next__
        per_sample = (base_ms + (slow_ms if rank == slow_rank else 0.0)) / 1000 / batch
        loader = iter(torch.utils.data.DataLoader(_Samples(per_sample), batch_size=batch))
        handler = torch.profiler.tensorboard_trace_handler(out, worker_name=f"rank{rank}")
        schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    schedule=schedule, on_trace_ready=handler,
                                    record_shapes=True) as prof:
            for _ in range(steps + 1):
                x, y = next(loader)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                prof.step()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_gloo_run(out: str | Path, ranks: int = 4, steps: int = 5, slow_rank: int | None = 2,
                  slow_ms: float = 40.0, base_ms: float = 0.0) -> Path:
    """Write one trace per rank into ``out``; returns the folder."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_rank, args=(ranks, _free_port(), str(out), steps,
                                    -1 if slow_rank is None else slow_rank, slow_ms,
                                    base_ms),
                       nprocs=ranks, join=True, start_method="spawn")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--slow-rank", type=int, default=2, help="-1: no straggler")
    p.add_argument("--slow-ms", type=float, default=40.0)
    p.add_argument("--base-ms", type=float, default=0.0,
                   help="every rank's data loading sleeps this long per step")
    a = p.parse_args()
    folder = make_gloo_run(a.out, a.ranks, a.steps, None if a.slow_rank < 0 else a.slow_rank,
                           a.slow_ms, a.base_ms)
    print("\n".join(sorted(str(f) for f in folder.iterdir())))


if __name__ == "__main__":
    main()
