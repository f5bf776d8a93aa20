"""The thin CUDA boundary: the only functions that touch ``torch.cuda.memory``.

Everything else works on what these return (a snapshot dict in torch's own
format, a ``memory_stats()`` dict), so the whole ``%%gpumem`` pipeline is
tested on a CPU-only machine by replacing exactly these four functions with
fakes that return real recorded data. Keep them this small: no logic here that
a fake would have to reproduce.
"""

from __future__ import annotations

from typing import Any


def cuda_available() -> bool:
    """Whether a CUDA device can be used (False on a CPU-only build)."""
    import torch

    return bool(torch.cuda.is_available())


def start_history(max_entries: int, stack_depth: int, device: int | None = None) -> None:
    """Turn on the allocator's history (``_record_memory_history``).

    ``stack_depth`` 0 records no stacks (cheapest); otherwise Python stacks are
    recorded with each event (torch has no depth limit; frames are trimmed
    later, when the result is built).
    """
    import torch

    torch.cuda.memory._record_memory_history(
        enabled="all",
        context="all" if stack_depth > 0 else None,
        stacks="python",
        max_entries=max_entries,
        device=device,
    )


def take_snapshot() -> dict[str, Any]:
    """The allocator's segments and history trace (``_snapshot``), torch's format."""
    import torch

    return torch.cuda.memory._snapshot()


def stop_history(device: int | None = None) -> None:
    """Turn the history off again (and let torch drop its buffer)."""
    import torch

    torch.cuda.memory._record_memory_history(enabled=None, device=device)


def memory_stats(device: int) -> dict[str, Any]:
    """``torch.cuda.memory_stats(device)`` as a plain dict (``{}`` without CUDA)."""
    import torch

    return dict(torch.cuda.memory_stats(device))
