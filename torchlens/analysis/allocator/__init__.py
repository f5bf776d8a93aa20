"""A replay model of PyTorch's CUDA caching allocator (pure Python, no torch).

Entry points: ``CachingAllocator`` (malloc/free/empty_cache, ``snapshot()``,
``memory_stats()``), ``replay`` (run a snapshot trace, "follow" or "simulate"),
``AllocatorConfig`` (PYTORCH_CUDA_ALLOC_CONF), ``rebuild_initial_state`` (the
state a mid-run trace started from) and ``fidelity.check_fidelity``.
"""

from .config import AllocatorConfig, allocation_size, round_size
from .core import OOM, CachingAllocator
from .rebuild import InitialState, rebuild_initial_state
from .replay import ReplayResult, replay
from .state import export_snapshot, load_segments

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
