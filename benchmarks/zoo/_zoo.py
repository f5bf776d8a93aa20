"""The one training loop every zoo job runs, with the knob that breaks it.

A zoo job is a few lines: ``train(**knobs)`` with the one problem it plants
(see answers.json beside this file). Everything else is shared: a gloo DDP
MLP on CPU, batches from a ``DataLoader`` over synthetic data, SGD, one
intra-op thread a rank, ``STEPS`` optimizer steps (``ZOO_STEPS`` overrides
it). Nothing here imports torchlens: ``torchlens run`` watches the job from
outside, as it watches a user's script.

Knobs (all off by default, ``ranks`` says which ranks a knob hits: ``"all"``
or a tuple of ranks):

- ``leak``: ``"losses"`` keeps every step's loss and logits tensors (for an
  epoch metric, without ``.detach()``: the logits and their graph stay
  alive), ``"cache"`` adds 1 MiB to a dict every step, ``"graph"`` sums a
  metric of the logits (their mean top-class probability) without ``.item()``
  (every step's graph kept alive, with the softmax it saved). Backward frees
  a trained loss's saved tensors, so a kept loss alone holds about 23 KB a
  step; the leaks users report hold their logits: with ``vocab`` 8192 those
  are 32 x 8192 floats, 1 MiB a step.
- ``vocab``: the head's outputs (classes): a language model's vocabulary.
- ``step_up``: ``"optimizer"`` unfreezes a large layer at ``STEPS // 3`` (its
  Adam state appears then, once); ``"cache"`` fills a warm-up cache once.
- ``data_sleep_ms``: the dataset sleeps that long per batch.
- ``slow_from``: the data sleep starts at that step (a node that starts
  throttling mid-run); 0, from the first.
- ``batch_factor``: that many times the batch (more compute a step).
- ``work_factor``: that many times the batch on every rank (hit or not): a
  step that keeps its core busy, as real training does (a rank that mostly
  waits gets its core back from a busy neighbour as soon as it wakes).
- ``cpu_hog``: every rank pinned to its own core, and a busy process
  pinned to the core of each rank hit.
- ``every`` / ``rank0_work``: ``"checkpoint"`` or ``"evaluate"`` on rank 0
  every ``every`` steps while the others wait in the next all-reduce.
- ``gc_churn``: many live objects, and objects that live a few steps, so
  full collections come often and each walks them all.
- ``per_sample_ms`` / ``workers``: per-sample loading cost and DataLoader workers.
- ``bucket_mb``: DDP's ``bucket_cap_mb``.
- ``accum`` / ``no_sync``: micro-batches a step, and whether DDP's ``no_sync``
  skips the all-reduce of all but the last.
- ``short_data``: the ranks hit run out of batches at ``STEPS // 2``.
- ``mismatch``: the ranks hit all-reduce a tensor of another size once.
- ``drift``: the ranks hit change their parameters outside DDP every step.
- ``crash_at``: the ranks hit raise at that step.
- ``kill_at``: the ranks hit die of SIGKILL at that step, as the OOM killer
  ends a process: no exception, no goodbye.
- ``stall_every`` / ``stall_ms``: the ranks hit sleep that long every so many steps.
- ``compiled``: the DDP model under ``torch.compile`` (backend ``ZOO_COMPILE_BACKEND``,
  default ``aot_eager``: dynamo's graphs, breaks, guards and recompiles are the
  same as under inductor, whose code generation takes tens of seconds a graph
  on a small CPU), with shapes kept static (``automatic_dynamic_shapes`` off,
  as a job that needs static shapes sets it).
- ``recompile_at``: at those steps the ranks hit take a batch of another size:
  a guard on its size fails and the model recompiles.
- ``graph_break``: the forward reads a tensor's value (``float(t)``) on the ranks
  hit: a graph break inside every step.
- ``amp``: ``"bf16"`` runs forward and loss under CPU autocast in bfloat16;
  ``"fp16"`` in float16 with a ``torch.amp.GradScaler("cpu")``.
- ``overflow_every``: with ``amp="fp16"``, every so many steps the ranks hit scale
  their batch by 1e4: the float16 forward overflows, the gradients are inf, and
  the scaler skips the optimizer step (DDP averages gradients, so every rank's
  are inf then, and every rank skips).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = int(os.environ.get("ZOO_STEPS", "100"))
BATCH = 32
IN_DIM = 128
HIDDEN = 256
OUT_DIM = 8
#: seconds a collective may wait before gloo gives up (bounds the jobs that hang)
TIMEOUT_S = float(os.environ.get("ZOO_TIMEOUT_S", "20"))


def hits(ranks: str | Iterable[int], rank: int) -> bool:
    """Whether a knob given for ``ranks`` applies to ``rank``."""
    return ranks == "all" or rank in tuple(ranks)  # type: ignore[arg-type]


class Batches(torch.utils.data.Dataset):
    """Item ``i`` is a sample, or a whole batch when ``batch`` > 0."""

    def __init__(self, n: int, batch: int, sleep_ms: float, per_sample_ms: float,
                 sleep_from: int = 0) -> None:
        self.n, self.batch, self.sleep_ms, self.per_sample_ms = n, batch, sleep_ms, per_sample_ms
        self.sleep_from = sleep_from

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_ms and i >= self.sleep_from:
            time.sleep(self.sleep_ms / 1000)
        if self.per_sample_ms:
            time.sleep(self.per_sample_ms / 1000)
        g = torch.Generator().manual_seed(i % 8)
        shape = (self.batch, IN_DIM) if self.batch else (IN_DIM,)
        y = (self.batch,) if self.batch else ()
        return torch.randn(*shape, generator=g), torch.randint(0, OUT_DIM, y, generator=g)


def _spin() -> None:
    while True:
        pass


class Net(nn.Module):
    def __init__(self, extra: int = 0, vocab: int = OUT_DIM) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU(),
                                  nn.Linear(HIDDEN, HIDDEN), nn.ReLU())
        self.head = nn.Linear(HIDDEN, vocab)
        # a large layer that starts frozen (the optimizer-state step-up job)
        self.extra = nn.Linear(HIDDEN, extra) if extra else None
        if self.extra is not None:
            self.extra.requires_grad_(False)
        self.reads_value = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if self.reads_value and float(h.mean()) < 0:  # a value read: a graph break
            h = -h
        out = self.head(h)
        if self.extra is not None:
            out = out + 0 * self.extra(h).mean()
        return out


def train(ranks: str | Iterable[int] = "all", *, leak: str = "", step_up: str = "",
          data_sleep_ms: float = 0, slow_from: int = 0, batch_factor: int = 1, work_factor: int = 1,
          cpu_hog: bool = False,
          every: int = 0, rank0_work: str = "", gc_churn: bool = False,
          per_sample_ms: float = 0, workers: int = 0, bucket_mb: float = 25,
          accum: int = 1, no_sync: bool = True, short_data: bool = False,
          mismatch: bool = False, drift: bool = False, crash_at: int = -1,
          kill_at: int = -1,
          stall_every: int = 0, stall_ms: float = 0, steps: int = STEPS,
          vocab: int = OUT_DIM, compiled: bool = False, recompile_at: tuple[int, ...] = (),
          graph_break: bool = False, amp: str = "", overflow_every: int = 0) -> None:
    """Run the job's training loop on this rank (torchrun's environment)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    me = hits(ranks, rank)
    torch.manual_seed(0)
    model = DDP(Net(extra=4096 if step_up == "optimizer" and me else 0, vocab=vocab),
                bucket_cap_mb=bucket_mb, find_unused_parameters=False)
    opt = torch.optim.Adam([p for p in model.parameters()], lr=1e-3)
    model.module.reads_value = graph_break and me
    run = model
    if compiled:
        torch._dynamo.config.automatic_dynamic_shapes = False
        run = torch.compile(model, backend=os.environ.get("ZOO_COMPILE_BACKEND", "aot_eager"))
    scaler = torch.amp.GradScaler("cpu") if amp == "fp16" else None
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16 if amp == "bf16" else torch.float16)
                if amp else contextlib.nullcontext())
    batch = BATCH * work_factor * (batch_factor if me else 1)
    batches = steps * accum // (2 if short_data and me else 1)
    if per_sample_ms:  # per-sample loading: the DataLoader batches them
        data = Batches(batches * batch, 0, 0, per_sample_ms)
        loader = torch.utils.data.DataLoader(data, batch_size=batch, num_workers=workers)
    else:
        data = Batches(batches, batch, data_sleep_ms if me else 0, 0, slow_from * accum)
        loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=workers)
    hog = None
    if cpu_hog:  # each rank pinned to its own core, as a launcher binding ranks does;
        cores = sorted(os.sched_getaffinity(0))  # the busy process shares rank 1's
        core = cores[rank % len(cores)]
        os.sched_setaffinity(0, {core})
        if me:
            hog = multiprocessing.get_context("fork").Process(target=_spin, daemon=True)
            hog.start()
            os.sched_setaffinity(hog.pid, {core})
    kept: list[Any] = []
    cache: dict[int, torch.Tensor] = {}
    total: Any = 0.0
    # lists, not dicts of ints: CPython stops tracking a dict that holds only
    # atomic values, and a collection never walks it again
    live = [[i] for i in range(1_500_000)] if gc_churn and me else []
    churn: list[list[list[int]]] = []
    it = iter(loader)
    try:
        for step in range(steps):
            if step == crash_at and me:
                raise RuntimeError(f"zoo: rank {rank} fails at step {step}")
            if step == kill_at and me:
                os.kill(os.getpid(), signal.SIGKILL)
            if stall_every and me and step % stall_every == stall_every - 1:
                time.sleep(stall_ms / 1000)
            if step_up == "optimizer" and me and step == steps // 3:
                model.module.extra.requires_grad_(True)
            if step_up == "cache" and me and step == steps // 3:
                cache[-1] = torch.ones(48, 1 << 20 >> 2)  # 48 MiB, once
            if gc_churn and me:  # objects that live a few steps reach the oldest
                churn.append([[step] for _ in range(50_000)])  # generation, so
                del churn[:-4]  # full collections come every few steps and walk `live`
            for micro in range(accum):
                x, y = next(it)  # StopIteration: this rank ran out of batches
                if me and step in recompile_at:  # another batch size: a guard fails
                    x, y = x[: len(x) - 8 * (1 + recompile_at.index(step))], \
                        y[: len(y) - 8 * (1 + recompile_at.index(step))]
                if me and overflow_every and step % overflow_every == overflow_every - 1:
                    x = x * 1e4  # float16 overflows: inf gradients, a skipped step
                last = micro == accum - 1
                ctx = model.no_sync() if accum > 1 and no_sync and not last else contextlib.nullcontext()
                with ctx:
                    with autocast:
                        out = run(x)
                        loss = nn.functional.cross_entropy(out.float(), y) / accum
                    (scaler.scale(loss) if scaler is not None else loss).backward()
            if mismatch and step == steps // 2:
                dist.all_reduce(torch.ones(3 if me else 5))
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
            if drift and me:
                with torch.no_grad():
                    model.module.head.weight.add_(1e-3 * (rank + 1))
            if me and leak == "losses":
                kept.append((loss, out))
            elif me and leak == "cache":
                cache[step] = torch.ones(1 << 20 >> 2)  # 1 MiB a step
            elif me and leak == "graph":
                total = total + out.softmax(-1).amax(-1).mean()
            else:
                total += loss.item()
            if every and rank == 0 and step % every == every - 1:
                _rank0(model, opt, rank0_work)
    except StopIteration:
        # the rank out of batches leaves the loop; the others wait for it in
        # their next all-reduce until gloo's timeout
        print(f"zoo: rank {rank} ran out of batches", flush=True)
    finally:
        if hog is not None:
            hog.kill()
    del live
    dist.destroy_process_group()


def _rank0(model: DDP, opt: torch.optim.Optimizer, work: str) -> None:
    """What rank 0 does alone every so many steps."""
    if work == "checkpoint":
        with tempfile.TemporaryDirectory() as d:
            state = {"model": model.state_dict(), "opt": opt.state_dict(),
                     "pad": torch.zeros(16 << 20 >> 2)}
            torch.save(state, os.path.join(d, "ckpt.pt"))
            time.sleep(0.05)  # the copy to slower storage
    elif work == "evaluate":
        with torch.no_grad():
            for _ in range(40):
                model.module(torch.randn(BATCH * 4, IN_DIM))
            time.sleep(0.05)


def main(**knobs: Any) -> None:
    """A job's entry point: ``train`` with the job's knobs."""
    gc.collect()
    train(**knobs)
