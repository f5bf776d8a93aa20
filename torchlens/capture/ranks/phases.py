"""The phases of a training step, timed on a rank of ``%ddp_check --profile``
or ``torchlens run`` (``PhaseClock``).

Why phase timers and not per-op hooks: the checker's ``TorchDispatchMode``
costs about 11 us per op (+37% on a 6.5 ms step). Here five Python wrappers
run a few times per step (DataLoader batches, ``DistributedDataParallel.forward``,
``backward``, ``Optimizer.step`` through torch's global optimizer hooks, and
the ``torch.distributed`` collectives the user calls), so a step costs a few
microseconds. DDP's wait for a late rank happens inside ``backward`` (C++),
which is why the late rank is found by comparing phases across ranks
(``analysis.ranks.steps``), not by watching collectives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

PHASES = ("data", "forward", "backward", "optimizer", "collective")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
               "broadcast", "broadcast_object_list", "reduce", "gather", "scatter", "barrier",
               "send", "recv", "isend", "irecv", "monitored_barrier")


class PhaseClock:
    """Accumulates the time spent in each phase; the outermost phase counts."""

    def __init__(self) -> None:
        self.spent = [0.0] * len(PHASES)
        self.active = -1
        self.entries = 0  # progress for the hang detector: grows inside long steps
        self.first: float | None = None  # when the first phase began (unix s)
        self.tick: Callable[[], None] | None = None
        self._undo: list[Callable[[], None]] = []
        self._opt_t0 = 0.0

    def take(self) -> dict[str, float]:
        out = {p: round(s, 7) for p, s in zip(PHASES, self.spent, strict=True)}
        self.spent = [0.0] * len(PHASES)
        return out

    def _wrap(self, index: int, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if clock.active >= 0:
                return fn(*args, **kwargs)
            clock.active, clock.entries = index, clock.entries + 1
            if clock.first is None:
                clock.first = time.time()
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                clock.spent[index] += time.perf_counter() - t
                clock.active = -1
                if clock.tick is not None:
                    clock.tick()

        timed.__wrapped__ = fn  # type: ignore[attr-defined]
        timed.__name__ = getattr(fn, "__name__", "timed")
        timed.__doc__ = getattr(fn, "__doc__", None)
        return timed

    def _patch(self, owner: Any, name: str, phase: str) -> None:
        original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if original is None:
            return
        setattr(owner, name, self._wrap(PHASES.index(phase), original))
        self._undo.append(lambda: setattr(owner, name, original))

    def install(self) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
        from torch.nn.parallel import DistributedDataParallel
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
        from torch.utils.data import dataloader

        self._patch(dataloader._BaseDataLoaderIter, "__next__", "data")
        self._patch(DistributedDataParallel, "forward", "forward")
        self._patch(torch.Tensor, "backward", "backward")
        self._patch(torch.autograd, "backward", "backward")
        for module in (dist, distributed_c10d):
            for name in COLLECTIVES:
                if callable(getattr(module, name, None)):
                    self._patch(module, name, "collective")
        optimizer = PHASES.index("optimizer")

        def pre(*_: Any) -> None:
            if self.active < 0:
                if self.first is None:
                    self.first = time.time()
                self.active, self.entries, self._opt_t0 = optimizer, self.entries + 1, time.perf_counter()

        def post(*_: Any) -> None:
            if self.active == optimizer:
                self.spent[optimizer] += time.perf_counter() - self._opt_t0
                self.active = -1
                if self.tick is not None:
                    self.tick()

        for handle in (register_optimizer_step_pre_hook(pre),
                       register_optimizer_step_post_hook(post)):
            self._undo.append(handle.remove)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()
