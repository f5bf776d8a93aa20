"""Run a zoo job as TraceML asks a plain PyTorch loop to be run:
``traceml run benchmarks/zoo/_traceml.py --nproc-per-node 2 ... --args JOB.py``.

TraceML instruments the Hugging Face Trainer, Lightning and RF-DETR by
itself; a plain loop must call ``traceml.init(mode="auto")`` after the
process group starts and wrap each step in ``traceml.trace_step(model)``
(its docs and DDP demos; ``benchmarks/ddp_jobs.py --traceml`` does the
same). The zoo's jobs stay as they are, so this file does those two things
from outside, then runs ``JOB.py`` as ``__main__``:

- ``traceml.init(mode="auto")`` right after the job's own
  ``init_process_group`` (its DataLoader, forward, backward and optimizer
  timers are installed then, before the job builds them);
- a step opens when the job's DataLoader hands over a batch and no step is
  open, and closes when the job calls ``zero_grad`` after its optimizer
  step (``_zoo.train``'s order), each as ``trace_step(ddp.module)``: the
  batch fetch is TraceML's input wait, outside the traced step, as in
  ``for x, y in loader: with trace_step(model): ...``.

Nothing else changes; a job TraceML instruments itself (``healthy_hf``,
``healthy_lightning``) is run directly, without this file.
"""

from __future__ import annotations

import contextlib
import runpy
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import traceml_ai as traceml
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

_state: dict[str, Any] = {"model": None, "step": None}


def _open_step() -> None:
    if _state["step"] is None and _state["model"] is not None:
        step = traceml.trace_step(_state["model"])
        step.__enter__()
        _state["step"] = step


def _close_step() -> None:
    step, _state["step"] = _state["step"], None
    if step is not None:
        step.__exit__(None, None, None)


def _patch() -> None:
    real_init = dist.init_process_group

    def init_then_traceml(*args: Any, **kwargs: Any) -> None:
        real_init(*args, **kwargs)
        traceml.init(mode="auto")
        # TraceML's DataLoader.__iter__ (its timed fetch) is in place now: each
        # batch it hands over opens the step, after its fetch timer closed
        timed_iter = DataLoader.__iter__

        def iter_then_step(self: DataLoader) -> Iterator[Any]:
            for batch in timed_iter(self):
                _open_step()
                yield batch

        DataLoader.__iter__ = iter_then_step  # type: ignore[method-assign]

    dist.init_process_group = init_then_traceml  # type: ignore[assignment]

    real_ddp = DistributedDataParallel.__init__

    def ddp_init(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        real_ddp(self, *args, **kwargs)
        _state["model"] = self.module

    DistributedDataParallel.__init__ = ddp_init  # type: ignore[method-assign]

    real_zero = torch.optim.Optimizer.zero_grad

    def zero_then_close(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
        real_zero(self, *args, **kwargs)
        _close_step()

    torch.optim.Optimizer.zero_grad = zero_then_close  # type: ignore[method-assign]


def main() -> None:
    job = sys.argv[1]
    sys.argv = [job, *sys.argv[2:]]
    _patch()
    try:
        runpy.run_path(job, run_name="__main__")
    finally:
        with contextlib.suppress(Exception):
            _close_step()


if __name__ == "__main__":
    main()
