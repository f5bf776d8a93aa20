"""The thin CUDA boundary: the only functions that touch ``torch.cuda.memory``.

Everything else works on what these return (a snapshot dict in torch's own
format, a ``memory_stats()`` dict), so the whole ``%%gpumem`` pipeline is
tested on a CPU-only machine by replacing exactly these functions with fakes
that return real recorded data. Keep them this small: no logic here that a
fake would have to reproduce.

Facts of torch 2.13's sources these functions rely on (torch/cuda/memory.py):
``_record_memory_history_impl`` takes ``device`` but never passes it on to
``_C._cuda_record_memory_history``, and the native allocator's
``recordHistory`` loops over every device's allocator: history is on for
every GPU or none. ``_snapshot(device=None)`` calls
``_C._cuda_memorySnapshot(None)``, also for every device. Under
``backend:cudaMallocAsync`` both ``recordHistory``/``isHistoryEnabled`` and
``snapshot`` raise RuntimeError (CUDAMallocAsyncAllocator.cpp: "cudaMallocAsync
does not yet support recordHistory").
"""

from __future__ import annotations

import inspect
from typing import Any

from torchlens.model.snapshot import Snapshot, normalize_snapshot


def cuda_available() -> bool:
    """Whether a CUDA device can be used (False on a CPU-only build)."""
    import torch

    return bool(torch.cuda.is_available())


def allocator_backend() -> str:
    """``"native"`` or ``"cudaMallocAsync"`` (``PYTORCH_CUDA_ALLOC_CONF=backend:...``)."""
    import torch

    get = getattr(torch.cuda.memory, "get_allocator_backend", None)
    return str(get()) if get is not None else "native"


def history_enabled() -> bool | None:
    """Whether allocator history is on already (the user's own recording); None when
    this torch cannot say. ``_cuda_isHistoryEnabled`` is what torch's own
    cudagraph_trees reads for the same question (torch/_inductor/cudagraph_trees.py)."""
    import torch

    probe = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    return bool(probe()) if probe is not None else None


def start_history(max_entries: int, stack_depth: int) -> None:
    """Turn on the allocator's history (``_record_memory_history``), on every device.

    ``stack_depth`` 0 records no stacks (cheapest); otherwise Python stacks are
    kept for allocations only (``context="alloc"``): the analysis never reads a
    free's stack, and ``"all"`` would gather a second stack per free (the OOM
    entry is recorded inside malloc, so it keeps its stack). Frames are trimmed
    later, when the result is built (torch has no depth limit).
    """
    import torch

    torch.cuda.memory._record_memory_history(
        enabled="all",
        context="alloc" if stack_depth > 0 else None,
        stacks="python",
        max_entries=max_entries,
    )


def take_snapshot() -> Snapshot:
    """The allocator's segments and history trace (``_snapshot``), every device, read
    once into a ``Snapshot``. ``_snapshot`` has no switch to leave the traces out."""
    import torch

    return normalize_snapshot(torch.cuda.memory._snapshot(),
                              name="torch.cuda.memory._snapshot()")


def take_segments() -> list[dict[str, Any]]:
    """The allocator's segments only, every device (``memory_snapshot``), without
    symbolizing a history the user may be recording: ``include_traces=False``
    where this torch has the switch (torch 2.13: ``memory_snapshot(mempool_id=None,
    include_traces=True)``), else the plain call."""
    import torch

    fn = torch.cuda.memory_snapshot
    if "include_traces" in inspect.signature(fn).parameters:
        return list(fn(include_traces=False))
    return list(fn())


def stop_history() -> None:
    """Turn the history off again, on every device (and let torch drop its buffer)."""
    import torch

    torch.cuda.memory._record_memory_history(enabled=None)


def memory_stats(device: int) -> dict[str, int]:
    """``torch.cuda.memory_stats(device)`` (counter name -> count or bytes) as a plain
    dict (``{}`` without CUDA)."""
    import torch

    return dict(torch.cuda.memory_stats(device))
