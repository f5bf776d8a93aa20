"""Per-rank figures of HolisticTraceAnalysis (HTA) from one ``Trace`` each.

``temporal_breakdown``, ``idle_time``, ``comm_comp_overlap`` and
``kernel_breakdown`` (and ``rank_figures``, all four at once) return plain
JSON-able dicts and lists, so each rank's trace can be summarised in its own
worker process and only the small result travels. Definitions, and where they
differ from HTA's: ``gpu`` (which GPU work, its kinds, the window) and
``figures`` (each figure).
"""

from .figures import (
    comm_comp_overlap,
    idle_time,
    kernel_breakdown,
    rank_figures,
    temporal_breakdown,
)
from .gpu import KINDS, GpuWork, gpu_work, kind_of

__all__ = ["KINDS", "GpuWork", "comm_comp_overlap", "gpu_work", "idle_time",
           "kernel_breakdown", "kind_of", "rank_figures", "temporal_breakdown"]
