"""%ddp_check figures (issue 4): time to checklist vs the bare spawn+gloo floor,
time from a mismatched collective to the named diagnosis, per-collective overhead.

Run: ``python benchmarks/bench_ddp.py [--repeat 3] [--collectives 300]``.
The floor is two fresh interpreters that import torch, join a gloo group on a
TCPStore the parent hosts on port 0, run one all_reduce and exit: what any
2-rank check must pay before it learns anything. "floor + DDP" also builds a
DistributedDataParallel and runs the same step as ``correct_step``: on torch
2.13 ``DDP.__init__`` imports torch._dynamo (seconds), a cost the user's own
step pays under torchrun too.

The machine is shared, so floor and check alternate within each repeat (the
ratio is per repeat; the best ratio and the median are printed), and the
per-collective figures come from one ``--strict`` check: on the same two
ranks, blocks of all_reduces alternate between no checks (the recorder's
dispatch mode switched off), recorded (the recorder with ``strict`` off),
``--strict`` and a second process group created under
``set_debug_level(DETAIL)`` (gloo wrapped as ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
does); the median block of each kind is kept. The DETAIL figure of two
separate bare runs (environment variable set at start) is printed too.
"""

from __future__ import annotations

import argparse
import functools
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
if os.environ.get("BENCH_DDP_STEP"):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(16, 8) + rank).pow(2).mean().backward()
    opt.step()
if n:
    for _ in range(10):
        dist.all_reduce(t)
    start = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    store.set(f"per/{rank}", str((time.perf_counter() - start) / n))
os._exit(0)
"""


def bare(collectives: int = 0, detail: bool = False,
         ddp_step: bool = False) -> tuple[float, float | None]:
    """(wall seconds, seconds per all_reduce or None) of the bare 2-rank floor."""
    import torch.distributed as dist

    start = time.perf_counter()
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    if detail:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if ddp_step:
        env["BENCH_DDP_STEP"] = "1"
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


def correct_gloo_step(rank, world_size):
    """A correct data-parallel step in plain gloo: gradients averaged by all_reduce.

    The issue's floor is spawn + gloo init. Building a ``torch.optim``
    optimizer or a ``DistributedDataParallel`` imports torch._dynamo (about
    2 s on this machine, checked: ``torch.optim.SGD(...)`` alone), a cost of
    the user's step, not of the check; this step has neither, so its ratio to
    the floor is the check's own cost. The DDP rows below are measured against
    the same step run bare ("floor + DDP").
    """
    import torch
    import torch.distributed as dist

    model = torch.nn.Linear(8, 4)
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    model(torch.randn(16, 8) + rank).pow(2).mean().backward()
    with torch.no_grad():
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p -= 0.1 * p.grad / world_size
    return model


def op_mismatch(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


KINDS = ("no checks", "recorded", "--strict", "DETAIL group")


def many_collectives(rank, world_size, n=300, block=20):
    """Seconds per all_reduce for each of ``KINDS``, from alternating blocks.

    Runs under a --strict check: the recorder is the current dispatch mode,
    and flipping its ``strict`` flag between blocks gives recorded and
    --strict on the same processes, gloo pairs and moments of machine load.
    Both ranks run the same schedule, so every block is matched across ranks.
    """
    import statistics
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed import DebugLevel, get_debug_level, set_debug_level
    from torch.utils._python_dispatch import (
        _disable_current_modes,
        _get_current_dispatch_mode,
    )

    rec = _get_current_dispatch_mode()
    assert rec is not None and rec.board is not None, "run under ddp_check(strict=True)"
    with _disable_current_modes():
        before = get_debug_level()
        set_debug_level(DebugLevel.DETAIL)  # only the group created now is wrapped
        try:
            detail = dist.new_group(list(range(world_size)))
        finally:
            set_debug_level(before)
    t = torch.ones(4)

    def timed(group=None):
        start = time.perf_counter()
        for _ in range(block):
            dist.all_reduce(t, group=group)
        return (time.perf_counter() - start) / block

    for _ in range(10):
        dist.all_reduce(t)
    times = {k: [] for k in KINDS}
    for _ in range(max(1, n // block)):
        with _disable_current_modes():
            times["no checks"].append(timed())
            times["DETAIL group"].append(timed(detail))
        rec.strict = False
        times["recorded"].append(timed())
        rec.strict = True
        times["--strict"].append(timed())
    return tuple(statistics.median(times[k]) for k in KINDS)


def check(fn, **kw):
    from torchlens.frontends.ddp.api import ddp_check

    start = time.perf_counter()
    result = ddp_check(fn, world_size=2, live=False, **kw)
    return time.perf_counter() - start, result


def to_diagnosis(result) -> float:
    """Seconds from the first fingerprint of the diverging collective to the result."""
    rec = result.records
    index = result.item("collective sequence").details["index"]
    issued = min(fps[index]["t"] for fps in rec.fingerprints if len(fps) > index)
    return rec.t0 + rec.wall_s - issued


def main() -> None:
    import statistics

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--collectives", type=int, default=300)
    args = ap.parse_args()
    rows = []
    for _ in range(args.repeat):  # interleaved: each ratio compares neighbours in time
        floor = bare()[0]
        gloo, result = check(correct_gloo_step, steps=1)
        assert result.ok, result.checklist  # the whole checklist ran and passed
        plain = check(correct_step, steps=1)[0]
        floor_ddp = bare(ddp_step=True)[0]
        full = check(correct_step, steps=2, strict=True)[0]
        rows.append((floor, plain, floor_ddp, full, gloo))
        print(f"  repeat: floor {floor:.2f} s, gloo step {gloo:.2f} s ({gloo / floor:.2f}x), "
              f"DDP step {plain:.2f} s ({plain / floor:.2f}x), "
              f"floor+DDP {floor_ddp:.2f} s ({plain / floor_ddp:.2f}x), "
              f"--steps 2 --strict {full:.2f} s ({full / floor:.2f}x)  "
              f"load {os.getloadavg()[0]:.2f}", flush=True)

    def stat(i, j):
        ratios = [r[i] / r[j] for r in rows]
        return f"best {min(ratios):.2f}x, median {statistics.median(ratios):.2f}x"

    print(f"floor (spawn 2 + gloo init + 1 all_reduce): best {min(r[0] for r in rows):.2f} s")
    print(f"floor + DDP step (imports torch._dynamo):    best {min(r[2] for r in rows):.2f} s")
    print(f"checklist, correct gloo step (no DDP):       best {min(r[4] for r in rows):.2f} s  "
          f"vs floor {stat(4, 0)}")
    print(f"checklist, correct DDP step, --steps 1:      best {min(r[1] for r in rows):.2f} s  "
          f"vs floor {stat(1, 0)}; vs floor+DDP {stat(1, 2)}")
    print(f"checklist, --steps 2 --strict:               best {min(r[3] for r in rows):.2f} s  "
          f"vs floor {stat(3, 0)}")
    _, strict = check(op_mismatch, steps=1, strict=True)
    print(f"mismatch -> diagnosis, --strict:               {to_diagnosis(strict):.2f} s")
    _, loose = check(op_mismatch, steps=1, timeout=3)
    print(f"mismatch -> diagnosis, no --strict, --timeout 3: {to_diagnosis(loose):.2f} s")
    n = args.collectives
    print(f"per all_reduce float32[4] (rank 0): {args.repeat} --strict runs; in each, "
          f"alternating blocks of 20, median of {n // 20} blocks per kind; "
          "(+ms, ratio) vs no checks of the same run:")
    runs = []
    for i in range(args.repeat):
        _, r = check(functools.partial(many_collectives, n=n), steps=1, strict=True)
        returned = r.records.ranks[0].steps[0].returned
        per = dict(zip(KINDS, (float(v) for v in returned.strip("()").split(",")),
                       strict=True))
        runs.append(per)
        base = per["no checks"]
        cells = [f"no checks {base * 1e3:.3f} ms"] + [
            f"{kind} {per[kind] * 1e3:.3f} ({(per[kind] - base) * 1e3:+.3f}, "
            f"{per[kind] / base:.2f}x)" for kind in KINDS[1:]]
        print(f"  run {i + 1}: " + " | ".join(cells) + f"  comparisons (rank 0): "
              f"{r.records.ranks[0].strict}  load {os.getloadavg()[0]:.2f}",
              flush=True)
    for kind in KINDS[1:]:
        added = [(p[kind] - p["no checks"]) * 1e3 for p in runs]
        print(f"  {kind:<13} adds median {statistics.median(added):+.3f} ms "
              f"(runs: {', '.join(f'{a:+.3f}' for a in added)})")
    extra = [(p["--strict"] - p["recorded"]) * 1e3 for p in runs]
    print(f"  --strict over recorded: median {statistics.median(extra):+.3f} ms")
    per_bare = bare(n)[1]
    per_detail = bare(n, detail=True)[1]
    print(f"separate runs: bare {per_bare * 1e3:.3f} ms, TORCH_DISTRIBUTED_DEBUG=DETAIL "
          f"{per_detail * 1e3:.3f} ms  ({(per_detail - per_bare) * 1e3:+.3f})")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
