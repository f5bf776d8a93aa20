"""Per-rank memory samples: RSS and live tensor bytes on CPU, CUDA where present.

Why a gc scan for tensor bytes: a CPU build keeps no allocator statistics
outside the profiler, and the profiler's memory events cost far more than a
scan of live tensors at the end of each step. The scan must run on the main
thread (see ``worker._heartbeat``). CUDA numbers come from the caching
allocator's own counters of the device named (the heartbeat thread's current
device is 0 on every rank) and are None (not 0) where there is no GPU.
"""

from __future__ import annotations

import gc
import os

import psutil
import torch

from torchlens.capture.ranks.cuda_device import counters
from torchlens.model.messages import MemoryReading

_PROCESS = psutil.Process(os.getpid())


def tensor_bytes() -> int:
    """Bytes of CPU storage held by live tensors (each storage counted once)."""
    seen: set[int] = set()
    total = 0
    for obj in gc.get_objects():
        try:
            if not issubclass(type(obj), torch.Tensor) or obj.device.type != "cpu":
                continue
            storage = obj.untyped_storage()
            ptr = storage.data_ptr()
        except Exception:  # noqa: BLE001 - sparse, meta, fake tensors: no storage
            continue
        if ptr and ptr not in seen:
            seen.add(ptr)
            total += storage.nbytes()
    return total


def sample(with_tensors: bool, device: torch.device | None = None) -> MemoryReading:
    """One reading; ``tensor_bytes`` only when asked (the scan costs milliseconds);
    CUDA bytes of ``device`` when it is a GPU and CUDA is up (None: not read)."""
    out = MemoryReading(rss=_PROCESS.memory_info().rss)
    if with_tensors:
        out.tensor_bytes = tensor_bytes()
    got = counters(device) if device is not None else None
    if got is not None:
        out.cuda_allocated, out.cuda_reserved = got["allocated"], got["reserved"]
    return out
