"""This process's memory right now, as rank-0 samples for the live sidebar."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from torchlens.capture.memory import cuda as cuda_memory
from torchlens.model.samples import PostedSample

Sample = list[PostedSample]


def memory_sampler(device: int) -> Callable[[], Sample]:
    """A function returning one sample: CUDA allocator bytes when a GPU is
    used, else the process's resident memory, marked ``source: rss`` (the
    CPU allocator has no "reserved", so that stays None rather than a
    made-up figure)."""
    if cuda_memory.cuda_available():
        def sample() -> Sample:
            stats = cuda_memory.memory_stats(device)
            return [PostedSample(rank=0, t=time.time(), device=device,
                                 allocated=stats.get("allocated_bytes.all.current"),
                                 reserved=stats.get("reserved_bytes.all.current"))]
        return sample

    import psutil

    proc = psutil.Process(os.getpid())

    def sample_rss() -> Sample:
        return [PostedSample(rank=0, t=time.time(), device=None,
                             allocated=proc.memory_info().rss, reserved=None, source="rss")]
    return sample_rss
