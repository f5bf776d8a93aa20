"""%ddp_check figures (issue 4): time to checklist vs the bare spawn+gloo floor,
time from a mismatched collective to the named diagnosis, per-collective overhead.

Run: ``python benchmarks/bench_ddp.py [--repeat 2] [--collectives 300]``.
The floor is two fresh interpreters that import torch, join a gloo group on a
TCPStore the parent hosts on port 0, run one all_reduce and exit: what any
2-rank check must pay before it learns anything.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

BARE = r"""
import os, sys, time
import torch, torch.distributed as dist
from datetime import timedelta
rank, port, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=2)
t = torch.ones(4)
dist.all_reduce(t)
if n:
    for _ in range(10):
        dist.all_reduce(t)
    start = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    store.set(f"per/{rank}", str((time.perf_counter() - start) / n))
os._exit(0)
"""


def bare(collectives: int = 0, detail: bool = False) -> tuple[float, float | None]:
    """(wall seconds, seconds per all_reduce or None) of the bare 2-rank floor."""
    import torch.distributed as dist

    start = time.perf_counter()
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    if detail:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    procs = [subprocess.Popen([sys.executable, "-c", BARE, str(r), str(store.port),
                               str(collectives)], env=env, start_new_session=True)
             for r in range(2)]
    for p in procs:
        p.wait()
    wall = time.perf_counter() - start
    per = float(store.get("per/0")) if collectives else None
    return wall, per


def correct_step(rank, world_size):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(16, 8) + rank).pow(2).mean().backward()
    opt.step()
    return model.module


def op_mismatch(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


def many_collectives(rank, world_size, n=300):
    import time

    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    for _ in range(10):
        dist.all_reduce(t)
    start = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / n


def check(fn, **kw):
    from torchlens.frontends.ddp_api import ddp_check

    start = time.perf_counter()
    result = ddp_check(fn, world_size=2, live=False, **kw)
    return time.perf_counter() - start, result


def to_diagnosis(result) -> float:
    """Seconds from the first fingerprint of the diverging collective to the result."""
    rec = result.records
    index = result.item("collective sequence").details["index"]
    issued = min(fps[index]["t"] for fps in rec["fingerprints"] if len(fps) > index)
    return rec["t0"] + rec["wall_s"] - issued


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--collectives", type=int, default=300)
    args = ap.parse_args()
    best = min
    floor = best(bare()[0] for _ in range(args.repeat))
    plain = best(check(correct_step, steps=1)[0] for _ in range(args.repeat))
    full = best(check(correct_step, steps=2, strict=True)[0] for _ in range(args.repeat))
    print(f"floor (spawn 2 + gloo init + 1 all_reduce): {floor:.2f} s")
    print(f"checklist, correct DDP step, --steps 1:        {plain:.2f} s  ({plain / floor:.2f}x)")
    print(f"checklist, --steps 2 --strict:                 {full:.2f} s  ({full / floor:.2f}x)")
    _, strict = check(op_mismatch, steps=1, strict=True)
    print(f"mismatch -> diagnosis, --strict:               {to_diagnosis(strict):.2f} s")
    _, loose = check(op_mismatch, steps=1, timeout=3)
    print(f"mismatch -> diagnosis, no --strict, --timeout 3: {to_diagnosis(loose):.2f} s")
    n = args.collectives
    per_bare = bare(n)[1]
    per_detail = bare(n, detail=True)[1]
    per = {}
    for strict_flag in (False, True):
        _, r = check(many_collectives, steps=1, strict=strict_flag)
        per[strict_flag] = float(r.records["ranks"][0]["steps"][0]["returned"])
    print(f"per all_reduce (float32[4], {n} calls, rank 0):")
    print(f"  no checks                     {per_bare * 1e3:.3f} ms")
    print(f"  recorded (%ddp_check)         {per[False] * 1e3:.3f} ms  (+{(per[False] - per_bare) * 1e3:.3f})")
    print(f"  --strict                      {per[True] * 1e3:.3f} ms  (+{(per[True] - per_bare) * 1e3:.3f})")
    print(f"  TORCH_DISTRIBUTED_DEBUG=DETAIL {per_detail * 1e3:.3f} ms  (+{(per_detail - per_bare) * 1e3:.3f})")


if __name__ == "__main__":
    main()
