"""The run report's sections on kernel launches, launch queues and memcpy/memset
bandwidth (tables of ``analysis.runs.launch_tables``; it only draws)."""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from torchlens.analysis.runs.analyze import RunAnalysis
from torchlens.model.units import format_count, format_gbps, format_percent, format_us
from torchlens.render import html, tables
from torchlens.render.page import section
from torchlens.render.tables import Column

NO_GPU = "no GPU work: nothing to measure (CPU-only traces)"




def _num(v: Any) -> str:
    return f"{v:,.2f}"



LAUNCHES = [Column("rank", "rank", str), Column("launches", "launches", format_count),
            Column("delay_mean_us", "launch delay: mean", format_us),
            Column("delay_p50_us", "median", format_us), Column("delay_max_us", "max", format_us),
            Column("cpu_mean_us", "launch call: mean", format_us),
            Column("gpu_mean_us", "GPU time: mean", format_us),
            Column("gpu_shorter_than_cpu_pct", "GPU shorter than launch", format_percent),
            Column("short_kernels", "short kernels", format_count),
            Column("runtime_outliers", "launch calls > cutoff", format_count),
            Column("delay_outliers", "delays > cutoff", format_count)]
OUTLIERS = [Column("rank", "rank", str), Column("name", "GPU work", str, False, 80),
            Column("api", "launched by", str, False), Column("delay_us", "launch delay", format_us),
            Column("cpu_us", "launch call", format_us), Column("gpu_us", "GPU time", format_us)]
QUEUES = [Column("rank", "rank", str), Column("stream", "stream", str),
          Column("launches", "launches", format_count), Column("mean", "queue: mean", _num),
          Column("p50", "median", _num), Column("p75", "75 %", _num), Column("max", "max", _num),
          Column("full_us", "time at 1024 (full)", format_us)]
MEMORY_BW = [Column("rank", "rank", str), Column("kind", "kind", str, False),
             Column("events", "events", format_count), Column("bytes", "bytes", format_count),
             Column("mean_GBps", "mean", format_gbps), Column("p50_GBps", "median", format_gbps),
             Column("max_GBps", "max", format_gbps)]
#: outlier rows shown per report (``run.launch_outliers()`` has them all)
MAX_OUTLIER_ROWS = 50


def launch_sections(a: RunAnalysis) -> list[Markup]:
    """Sections for launches, queues and memory bandwidth; one plain note when
    no rank has GPU work."""
    if not any(r.gpu for r in a.launches):
        if not a.launches:
            return []
        return [section("Kernel launches, queues and memory bandwidth",
                        html.note(NO_GPU), "launches")]
    cut = next((r for r in a.launches if r.runtime_cutoff_us is not None), None)
    runtime_us = cut.runtime_cutoff_us if cut is not None else None
    delay_us = cut.launch_delay_cutoff_us if cut is not None else None
    legend = ("Each GPU kernel, memcpy or memset paired with the runtime call that launched it "
              "(same correlation id). Launch delay: GPU start minus the launch call's end. "
              "Short kernels: GPU time shorter than the launch call, with the call at most "
              f"{runtime_us or 50:g} µs; cutoffs (HTA's): launch call > "
              f"{runtime_us or 50:g} µs, launch delay > "
              f"{delay_us or 100:g} µs.")
    rows = [r for r in a.launches if r.gpu]
    parts = [html.note(legend), tables.html_table(rows, LAUNCHES)]
    if len(rows) < len(a.launches):
        parts.append(html.note(f"{len(a.launches) - len(rows)} rank(s) without GPU work: "
                               "nothing to measure there"))
    outliers = a.launch_outliers[:MAX_OUTLIER_ROWS]
    if outliers:
        parts += [html.note("Longest launch delays"), tables.html_table(outliers, OUTLIERS)]
    out = [section("Kernel launches", html.join(parts), "launches")]
    out.append(section("Launch queue per stream", html.join(
        [html.note("Operations launched on a stream and not yet started, at each change "
                   "(HTA's queue length); CUDA blocks the launching thread at 1024."),
         tables.html_table(a.queues, QUEUES) if a.queues
         else html.note("no launch calls paired with GPU work: nothing to measure")]),
        "queues"))
    out.append(section("Memcpy / memset bandwidth", html.join(
        [tables.html_table(a.memory_bw, MEMORY_BW) if a.memory_bw
         else html.note("no memcpy or memset with a byte count: nothing to measure")]),
        "memory-bw"))
    return out
