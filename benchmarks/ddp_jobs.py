"""The DDP training job every side of the rank-profiling benchmark runs (issue 12).

A 2-rank gloo DDP job: an MLP trained with SGD on batches from a ``DataLoader``
over a synthetic dataset. One rank (``slow_rank``) can be made an input
straggler: its dataset's ``__getitem__`` sleeps ``slow_ms`` per batch (each
dataset item *is* one batch, ``DataLoader(batch_size=None)``, so the delay is
one sleep per step, not many sub-millisecond ones). The other rank then waits
for it in DDP's gradient all_reduce, so both ranks' steps get slower: the
question for a tool is whether it names the slow rank and the cause.

The step time is measured here, with ``time.perf_counter``, from the end of
one step to the end of the next (batch fetch, forward, backward with DDP's
all_reduce, optimizer step, and the tool's own per-step hook: ``mark_step()``
or the ``step_context`` around the compute), and written per rank to
``<out>/rank<r>.json``, with the rank process's CPU time per step
(``time.process_time``, every thread of the process: a tool's in-process
threads count, its other processes do not). No tool's own number is trusted.

Three ways to run it:

(a) bare, under torchrun::

      OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 2 \\
          benchmarks/ddp_jobs.py --steps 300 --out bare-steps

(b) under TraceML's launcher (it runs ``torch.distributed.run`` itself, starts
    its aggregator, and executes this file as ``__main__`` in every rank);
    ``--traceml`` calls ``traceml.init(mode="auto")`` and wraps each step's
    compute in ``traceml.trace_step(model.module)``, as its docs and its
    ``dev/demo/mlp_ddp_input_straggler.py`` do::

      OMP_NUM_THREADS=1 traceml run benchmarks/ddp_jobs.py --nproc-per-node 2 \\
          --mode summary --logs-dir tml-logs --run-name r1 \\
          --args --traceml --steps 300 --out tml-steps

(c) as a function, for torchlens (``%ddp_check train --profile`` or
    ``torchlens.ddp_check``), which starts the process group itself and calls
    ``fn(rank, world_size)``; pass ``mark_step=torchlens.step``::

      train(rank, world_size, steps=300, mark_step=torchlens.step)

Defaults give ~6.5 ms steps on the project's 2-core machine with one
intra-op thread per rank (``OMP_NUM_THREADS=1``; ``train`` also calls
``torch.set_num_threads``): median 6.5 ms (5.2-7.2 over 5 runs) at load ~1.3,
of which ~4 ms is the rank's own CPU (forward/backward/SGD ~1.5 ms, the rest
gloo's all_reduce of 0.22 M parameters); the other rank's process and gloo's
threads share the two cores. Expect 8-10 ms on a busy machine. With
``--slow-ms 5`` on one rank the step becomes ~10 ms (the sleep frees a core,
so not the full +5 ms).

For torchlens: ``%ddp_check`` runs ``fn`` ``steps`` times per rank (default
2), and ``train`` is a whole training loop, so run it with ``steps=1``;
cloudpickle sends ``train`` by reference, so the ranks need ``benchmarks/`` on
``sys.path``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# Model and batch: ~6.5 ms per step on the 2-core machine, 2 ranks, 1 thread each.
BATCH = 64
IN_DIM = 256
HIDDEN = 288
DEPTH = 2  # hidden Linear+ReLU blocks after the input layer
OUT_DIM = 16
POOL = 8  # distinct pre-made batches the dataset cycles through


class SyntheticBatches:
    """Map-style dataset whose item ``i`` is a whole batch ``(x, y)``.

    ``__getitem__`` sleeps ``slow_ms`` on the chosen rank (the input
    straggler), and is otherwise only an index into a small pre-made pool, so
    a fetch costs microseconds.
    """

    def __init__(self, rank: int, length: int, slow_ms: float = 0.0) -> None:
        import torch

        gen = torch.Generator().manual_seed(1234 + rank)
        self.x = torch.randn(POOL, BATCH, IN_DIM, generator=gen)
        self.y = torch.randint(0, OUT_DIM, (POOL, BATCH), generator=gen)
        self.length = length
        self.delay_s = slow_ms / 1000.0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        if i >= self.length:
            raise IndexError(i)
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[i % POOL], self.y[i % POOL]


def make_model() -> Any:
    import torch

    torch.manual_seed(0)
    layers: list[Any] = [torch.nn.Linear(IN_DIM, HIDDEN), torch.nn.ReLU()]
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(HIDDEN, OUT_DIM))
    return torch.nn.Sequential(*layers)


def summarise(step_s: list[float], warmup: int, cpu_s: list[float] | None = None) -> dict[str, Any]:
    """Median / mean / p90 in ms of the steps after ``warmup`` (and median CPU ms)."""
    kept = sorted(step_s[warmup:]) or sorted(step_s)
    ms = [s * 1000.0 for s in kept]
    out = {
        "median_ms": statistics.median(ms),
        "mean_ms": statistics.fmean(ms),
        "p90_ms": ms[min(len(ms) - 1, int(0.9 * len(ms)))],
        "kept_steps": len(ms),
    }
    if cpu_s:
        out["cpu_median_ms"] = statistics.median(c * 1000.0 for c in (cpu_s[warmup:] or cpu_s))
    return out


def train(rank: int, world_size: int, steps: int = 300, mark_step: Callable[[], Any] | None = None,
          *, slow_rank: int | None = None, slow_ms: float = 0.0, warmup: int = 30,
          out: str | None = None, step_context: Callable[[Any], Any] | None = None,
          threads: int = 1, lr: float = 0.01) -> dict[str, Any]:
    """Run ``steps`` DDP steps on this rank; return (and write) its step times.

    The default process group is used if it exists (torchlens starts it);
    otherwise it is started from torchrun's environment with gloo.
    ``mark_step()`` is called at the end of every step (``torchlens.step``);
    ``step_context(model.module)`` returns a context manager that wraps each
    step's compute (``traceml.trace_step``). ``out``: folder for
    ``rank<r>.json``.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(threads)
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world_size)

    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    delay = slow_ms if slow_rank is not None and rank == slow_rank else 0.0
    loader = torch.utils.data.DataLoader(SyntheticBatches(rank, steps, delay),
                                         batch_size=None, shuffle=False, num_workers=0)
    wrap = step_context or (lambda _m: contextlib.nullcontext())

    step_s: list[float] = []
    cpu_s: list[float] = []  # this process's CPU time per step, all its threads
    dist.barrier()  # both ranks start the clock together
    t_prev, c_prev = time.perf_counter(), time.process_time()
    for x, y in loader:
        with wrap(model.module):
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        if mark_step is not None:
            mark_step()
        t, c = time.perf_counter(), time.process_time()
        step_s.append(t - t_prev)
        cpu_s.append(c - c_prev)
        t_prev, c_prev = t, c

    record = {"rank": rank, "world_size": world_size, "steps": len(step_s), "warmup": warmup,
              "slow_rank": slow_rank, "slow_ms": slow_ms, "delay_ms_this_rank": delay,
              "threads": threads, "step_s": step_s, "cpu_s": cpu_s,
              **summarise(step_s, warmup, cpu_s)}
    if out:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"rank{rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
    return record


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--out", default=None, help="folder for rank<r>.json")
    p.add_argument("--traceml", action="store_true",
                   help="traceml.init(mode='auto') + traceml.trace_step around each step "
                        "(launch with `traceml run`)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    step_context = None
    if args.traceml:
        import torch.distributed as dist
        import traceml_ai as traceml

        # As in TraceML's own DDP demos: process group first, then init.
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        traceml.init(mode="auto")
        step_context = traceml.trace_step
    train(rank, world_size, args.steps, None, slow_rank=args.slow_rank, slow_ms=args.slow_ms,
          warmup=args.warmup, out=args.out, step_context=step_context)

    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
