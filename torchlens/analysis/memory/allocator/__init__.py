"""A replay model of PyTorch's CUDA caching allocator (pure Python, no torch).

Entry points: ``CachingAllocator`` (malloc/free/empty_cache, ``snapshot()``,
``memory_stats()``), ``replay`` (run a snapshot trace, "follow" or "simulate"),
``AllocatorConfig`` (PYTORCH_CUDA_ALLOC_CONF), ``rebuild_initial_state`` (the
state a mid-run trace started from) and ``fidelity.check_fidelity``.
"""

from torchlens.analysis.memory.allocator.config import (
    AllocatorConfig,
    allocation_size,
    round_size,
)
from torchlens.analysis.memory.allocator.core import OOM, CachingAllocator
from torchlens.analysis.memory.allocator.rebuild import (
    InitialState,
    rebuild_initial_state,
)
from torchlens.analysis.memory.allocator.replay import ReplayResult, replay
from torchlens.analysis.memory.allocator.state import export_snapshot, load_segments

__all__ = [
    "OOM",
    "AllocatorConfig",
    "CachingAllocator",
    "InitialState",
    "ReplayResult",
    "allocation_size",
    "export_snapshot",
    "load_segments",
    "rebuild_initial_state",
    "replay",
    "round_size",
]
