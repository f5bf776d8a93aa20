"""Per-rank figures of HolisticTraceAnalysis (HTA) from one ``Trace`` each.

``temporal_breakdown``, ``idle_time``, ``comm_comp_overlap`` and
``kernel_breakdown`` (and ``rank_figures``, all four at once) return plain
JSON-able dicts and lists, so each rank's trace can be summarised in its own
worker process and only the small result travels. Definitions, and where they
differ from HTA's: ``gpu`` (which GPU work, its kinds, the window) and
``figures`` (each figure). ``collectives`` lists each rank's collectives
(``rank_collectives``) and matches them across ranks (``collective_rows``);
``slow_ranks`` says who waited for whom and which ranks stand out
(``straggler_rows``, ``findings``); ``run`` turns every rank's figures into
the run's tables. ``comm_overlap`` (``collective_overlap``) splits the
overlap by collective (all_gather, reduce_scatter, all_reduce, other). ``launches`` (``launch_stats``: CUDA kernel launch
statistics) and ``counters`` (``queue_length``, ``memory_bandwidth``) add
HTA's remaining per-rank figures.
"""

from torchlens.analysis.runs.collectives import (
    collective_rows,
    collective_table,
    rank_collectives,
)
from torchlens.analysis.runs.counters import memory_bandwidth, queue_length
from torchlens.analysis.runs.figures import (
    comm_comp_overlap,
    idle_time,
    kernel_breakdown,
    rank_figures,
    temporal_breakdown,
)
from torchlens.analysis.runs.launches import launch_stats
from torchlens.analysis.runs.slow_ranks import findings, straggler_rows
from torchlens.analysis.trace.comm_overlap import (
    COLLECTIVES,
    collective_of,
    collective_overlap,
)
from torchlens.analysis.trace.gpu import KINDS, GpuWork, gpu_work, kind_of

__all__ = ["COLLECTIVES", "KINDS", "GpuWork", "collective_of", "collective_overlap",
           "collective_rows", "collective_table", "comm_comp_overlap",
           "findings", "gpu_work", "idle_time", "kernel_breakdown", "kind_of", "launch_stats",
           "memory_bandwidth", "queue_length",
           "rank_collectives", "rank_figures", "straggler_rows", "temporal_breakdown"]
