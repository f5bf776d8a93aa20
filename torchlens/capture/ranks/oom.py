"""A rank that ran out of CUDA memory: the allocator's snapshot into the run
folder, or the reason there is none.

Why not only ``torch.cuda.OutOfMemoryError``: the caching allocator raises
that, but NCCL and cuBLAS report their own failed allocations through
``C10_CUDA_CHECK`` / NCCL's error text, as a plain ``RuntimeError`` (or
``DistBackendError``) whose message says "CUDA error: out of memory".

The snapshot is what ``%%gpumem``'s OOM diagnosis reads; without memory
history it still holds every segment and block at the moment of the OOM.
"""

from __future__ import annotations

import os
import pickle
import re

import torch

from torchlens.capture.ranks.cuda_device import allocator_backend, cuda_in_use
from torchlens.model.messages import OomOutcome

_OOM_TEXT = re.compile(r"CUDA out of memory|CUDA error: out of memory"
                       r"|Cuda failure \d* ?'out of memory'")
_CHAIN = 8  # how far along __cause__/__context__ an OOM is looked for


def is_cuda_oom(exc: BaseException | None) -> bool:
    """True for the allocator's OutOfMemoryError or a CUDA/NCCL "out of memory"
    error, raised itself or as the cause of what the rank raised."""
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    for _ in range(_CHAIN):
        if exc is None:
            return False
        if oom is not None and isinstance(exc, oom):
            return True
        if isinstance(exc, RuntimeError) and _OOM_TEXT.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def save_oom_snapshot(exc: BaseException, run_dir: str, rank: int) -> OomOutcome | None:
    """None when ``exc`` is no CUDA OOM; else the snapshot's path, or None and
    why no snapshot was saved."""
    if not is_cuda_oom(exc):
        return None
    if not cuda_in_use():
        return OomOutcome(why="CUDA was never initialised in this process")
    if allocator_backend() == "cudaMallocAsync":
        return OomOutcome(why=(
            "PYTORCH_CUDA_ALLOC_CONF has backend:cudaMallocAsync, which keeps no "
            "per-block state: torch cannot snapshot it (the OOM message is what there is)"))
    path = os.path.join(run_dir, f"rank{rank}", "oom.pickle")
    try:
        snapshot = torch.cuda.memory._snapshot()
        with open(path, "wb") as fh:
            pickle.dump(snapshot, fh)
    except Exception as err:  # noqa: BLE001 - reported to the caller, the OOM goes on
        return OomOutcome(why=f"the allocator snapshot failed: "
                              f"{type(err).__name__}: {str(err).strip()[:300]}")
    return OomOutcome(path=path)


def oom_line(rank: int, outcome: OomOutcome) -> str:
    """The one line a rank's log gets about its OOM snapshot."""
    return f"torchlens rank {rank}: {outcome.words()}"
