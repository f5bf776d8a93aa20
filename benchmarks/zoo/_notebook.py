"""Zoo jobs as notebook functions, for ``%ddp_check --profile`` (``torchlens.ddp_check(fn,
profile=True)``): the same loop and knobs as the job file each is named after
(``JOB.py``'s ``main(...)``, its answer in ``answers.json`` under that job).

``%ddp_check`` starts the process group before it calls the function on each
spawned rank, so ``train``'s own ``init_process_group`` and
``destroy_process_group`` are no-ops there, as they are for a notebook user's
loop; the optimizer's steps end the profiled steps (no ``torchlens.step()``).
Jobs whose problem needs their own launcher or process set-up are not here:
``cpu_contention`` (a pinned busy process), the Hugging Face and Lightning
jobs, the 4-rank one.

``FUNCTIONS``: job name -> function; ``benchmarks/check_zoo.py --views
ddp_check`` runs each on 2 ranks and scores the checklist.
"""

from __future__ import annotations

from collections.abc import Callable

from _zoo import train


def healthy_2(rank: int, world_size: int) -> None:
    """Nothing planted."""
    train()


def leak_cache_all(rank: int, world_size: int) -> None:
    """A cache that grows 1 MiB a step on every rank."""
    train(leak="cache")


def leak_losses_one(rank: int, world_size: int) -> None:
    """Rank 1 keeps every step's loss and logits (1 MiB a step)."""
    train(ranks=(1,), leak="losses", vocab=8192)


def data_straggler(rank: int, world_size: int) -> None:
    """Rank 1's dataset sleeps 30 ms a batch."""
    train(ranks=(1,), data_sleep_ms=30)


def compute_straggler(rank: int, world_size: int) -> None:
    """Rank 1's batch is 32 times the others'."""
    train(ranks=(1,), batch_factor=32)


def periodic_stall(rank: int, world_size: int) -> None:
    """Rank 1 sleeps 150 ms every 10th step."""
    train(ranks=(1,), stall_every=10, stall_ms=150)


def checkpoint_rank0(rank: int, world_size: int) -> None:
    """Rank 0 saves a checkpoint every 10 steps while the others wait."""
    train(every=10, rank0_work="checkpoint")


def evaluate_rank0(rank: int, world_size: int) -> None:
    """Rank 0 evaluates every 10 steps while the others wait."""
    train(every=10, rank0_work="evaluate")


def collective_mismatch(rank: int, world_size: int) -> None:
    """Rank 1 all-reduces a tensor of another size once, half-way."""
    train(ranks=(1,), mismatch=True)


def crash_one(rank: int, world_size: int) -> None:
    """Rank 1 raises at step 40."""
    train(ranks=(1,), crash_at=40)


def uneven_inputs(rank: int, world_size: int) -> None:
    """Rank 1 runs out of batches half-way; the other waits in its next all-reduce."""
    train(ranks=(1,), short_data=True)


def param_drift(rank: int, world_size: int) -> None:
    """Rank 1 changes its parameters outside DDP every step."""
    train(ranks=(1,), drift=True)


FUNCTIONS: dict[str, Callable[[int, int], None]] = {f.__name__: f for f in (
    healthy_2, leak_cache_all, leak_losses_one, data_straggler, compute_straggler,
    periodic_stall, checkpoint_rank0, evaluate_rank0, collective_mismatch, crash_one,
    uneven_inputs, param_drift)}
