"""The report of a ``run`` (per-rank traces analysed together): findings first,
then one chart of every rank's GPU time and the per-rank tables.

The chart and tables stay small at any world size: one bar and one row per
rank (idle time: one row per rank and stream), whatever each trace held.
"""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.plotting import figure
from markupsafe import Markup

from torchlens.analysis.runs.analyze import NS_NOTE, RunAnalysis, unsaid_problems
from torchlens.analysis.runs.collectives import arrived_by_note
from torchlens.analysis.runs.fsdp import fsdp_lines
from torchlens.analysis.runs.rows import CollectiveRow
from torchlens.model import Profile
from torchlens.model.findings import FAILED, WARNING
from torchlens.model.units import (
    format_bytes,
    format_count,
    format_gbps,
    format_percent,
    format_us_as_ms,
)
from torchlens.render import html, tables
from torchlens.render.findings import finding_text, findings_html
from torchlens.render.fsdp import FSDP_COLUMNS
from torchlens.render.legend import legend_above
from torchlens.render.page import section
from torchlens.render.runs import memory_chart
from torchlens.render.runs import steps_chart as run_steps_chart
from torchlens.render.runs import timeline as run_timeline
from torchlens.render.runs.launches import launch_sections
from torchlens.render.runs.lead import counted_line
from torchlens.render.tables import Column

PARTS = (("compute", "#1f77b4"), ("non_compute", "#ff7f0e"), ("idle", "#c7c7c7"))




TEMPORAL = [Column("rank", "rank", str), Column("traces", "traces", str),
            Column("span_us", "GPU timeline", format_us_as_ms), Column("compute_pct", "compute", format_percent),
            Column("non_compute_pct", "non-compute", format_percent), Column("idle_pct", "idle", format_percent)]
OVERLAP = [Column("rank", "rank", str), Column("collective", "collective", str, False),
           Column("communication_us", "communication", format_us_as_ms),
           Column("overlapped_us", "overlapped by compute", format_us_as_ms),
           Column("overlap_pct", "overlap", format_percent),
           Column("exposed_us", "exposed (not overlapped)", format_us_as_ms),
           Column("exposed_pct", "exposed, share of GPU timeline", format_percent)]
OVERLAP_NOTE = ("Measured from GPU kernels: the time each collective's kernels run while a "
                "compute kernel also runs. all_gather is FSDP's parameter gather (unshard and "
                "prefetch), reduce_scatter its gradient reduction, all_reduce DDP's; exposed "
                "all_gather is prefetch that compute did not hide. Collectives on different "
                "streams can run at once, so their rows can add up to more than all "
                "collectives.")
#: what the report and the text view say when no rank ran a GPU kernel
NO_GPU_OVERLAP = ("Overlap is measured from GPU kernels only: no rank's trace holds GPU "
                  "kernels (a CPU run, e.g. gloo), so communication overlap is not available "
                  "for this run.")
#: the one line a run without GPU work gets in place of every GPU section
NOT_MEASURED = ("No rank's trace holds GPU work (CPU-only traces, e.g. a gloo job), so "
                "nothing was measured for GPU time per rank (compute, non-compute, idle), "
                "communication overlapped by compute, kernels by kind, idle time per stream, "
                "kernel launches, launch queues or memory bandwidth: those sections are left "
                "out.")
KERNELS = [Column("rank", "rank", str), Column("kind", "kind", str, False),
           Column("count", "kernels", format_count), Column("us", "time", format_us_as_ms),
           Column("pct", "share", format_percent)]
IDLE = [Column("rank", "rank", str), Column("stream", "stream", str),
        Column("idle_us", "idle", format_us_as_ms), Column("host_wait_pct", "host wait", format_percent),
        Column("kernel_wait_pct", "kernel wait", format_percent), Column("other_pct", "other", format_percent)]
SKEW = [Column("step", "step", str), Column("ranks", "ranks", str),
        Column("median_us", "median of the ranks", format_us_as_ms), Column("max_us", "longest", format_us_as_ms),
        Column("longest_rank", "longest on rank", str), Column("skew_pct", "skew", format_percent)]
STRAGGLERS = [Column("rank", "rank", str), Column("collectives", "collectives", format_count),
              Column("last", "arrived last", format_count), Column("last_pct", "share", format_percent),
              Column("caused_us", "others waited for it (all together)", format_us_as_ms),
              Column("caused_mean_us", "each other rank, per such collective",
                     format_us_as_ms),
              Column("wait_per_step_us", "each other rank, per step", format_us_as_ms),
              Column("waited_us", "it waited for others", format_us_as_ms),
              Column("cause_words", "likely cause", str, False, 120)]
COLLECTIVES = [Column("step", "step", str), Column("trace", "trace", str),
               Column("seq", "#", str), Column("name", "collective", str, False),
               Column("mismatch", "ranks disagree", str, False, 80),
               Column("bytes", "bytes", format_count), Column("last_rank", "last rank", str),
               Column("max_wait_us", "first to last arrival", format_us_as_ms),
               Column("arrived_by", "arrived by", str, False),
               Column("dur_us", "duration", format_us_as_ms), Column("busbw_GBps", "bus bandwidth",
                                                         format_gbps)]
#: a report of a long run lists the first collectives; --json and the DataFrame hold all
MAX_COLLECTIVE_ROWS = 200
#: the FSDP section's table: the %ddp_check ranks table's FSDP columns, with the
#: gathered bytes of all parameters beside the shards and the peak's modules and step
FSDP = [Column("rank", "rank", str), FSDP_COLUMNS[0],
        Column("fsdp_unsharded", "all parameters gathered", format_bytes),
        *FSDP_COLUMNS[1:3], Column("gathered_modules", "modules gathered at once", str, False),
        Column("gathered_step", "in step", str), *FSDP_COLUMNS[3:]]
PROBLEMS = [Column("kind", "problem", str, False), Column("path", "file", str, False, 120),
            Column("message", "what", str, False)]


def _filled(value: Any) -> bool:
    return value not in (None, "", [], {})


def collective_columns(rows: list[CollectiveRow]) -> list[Column]:
    """The collectives table's columns for ``rows``: a column no row fills is
    left out (gloo traces record no message size, so no bytes or bandwidth);
    ``step`` when the traces are one step each, with ``#`` the collective's
    place in its step, else ``trace`` when there are several, ``#`` its
    place in that trace (left out when every step holds one collective)."""
    stepped = any(_filled(r.step) for r in rows)
    traces = len({r.trace for r in rows}) > 1
    out = []
    for c in COLLECTIVES:
        if c.key == "trace" and (stepped or not traces):
            continue
        if c.key == "seq":
            if stepped and all(r.seq == 0 for r in rows):
                continue  # one collective per step: the step column says it
            out.append(Column("seq", "# in step" if stepped else "# in trace" if traces
                              else "#", str))
        elif c.key in ("seq", "name") or any(_filled(tables.cell_value(r, c.key)) for r in rows):
            out.append(c)
    return out


#: the most of a failure's sentence the headline holds (an exception's message can be long)
HEADLINE_CHARS = 160


def summary_line(profile: Profile, a: RunAnalysis) -> str:
    """``run: 2 ranks of 2 analysed``; a run that failed (its leading finding
    failed: a rank raised, a node was lost) or has a problem (a warning: the
    slow rank, a memory creep) says so first, in the finding's words."""
    counted = counted_line(a).removeprefix("run: ")
    lead = a.verdict
    if lead is None or lead.severity not in (FAILED, WARNING):
        return f"run: {counted}"
    return f"run: {headline(lead.sentence)} ({counted})"


def headline(sentence: str) -> str:
    """A finding's sentence as the headline holds it: whole when short; else
    its first clause (up to the first ``; ``: who and why, where the figures
    follow), else cut at a word, with an ellipsis. The whole sentence is in
    the findings below it."""
    if len(sentence) <= HEADLINE_CHARS:
        return sentence
    first = sentence.split("; ", 1)[0]
    if len(first) <= HEADLINE_CHARS:
        return first + " …"
    cut = sentence[:HEADLINE_CHARS - 1]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut).rstrip(" ,;:") + "…"


def text_report(profile: Profile, a: RunAnalysis) -> str:
    lines = [summary_line(profile, a), *(f"- {finding_text(f)}" for f in a.findings)]
    for r in a.temporal:
        if r.idle_pct is None:
            lines.append(f"rank {r.rank}: no GPU work in its trace(s)")
        else:
            lines.append(f"rank {r.rank}: compute {format_percent(r.compute_pct)}, non-compute "
                         f"{format_percent(r.non_compute_pct)}, idle {format_percent(r.idle_pct)}")
    if not _any_gpu(a):
        lines.append(f"overlap: {NO_GPU_OVERLAP}")
    lines += fsdp_lines(a.fsdp)
    lines += [f"problem: {p.kind}: {p.path}: {p.message}" for p in unsaid_problems(a.problems)]
    return "\n".join(lines)


def _fsdp_section(a: RunAnalysis) -> Markup:
    """Each FSDP rank's parameter and optimizer memory: the table, then the
    figures in words, each said measured or not (as ``%ddp_check`` says them)."""
    shown = [c for c in FSDP if any(tables.cell_value(row, c.key) is not None for row in a.fsdp)]
    words = [html.note(line) for line in fsdp_lines(a.fsdp)]
    return section("FSDP memory per rank", html.join(
        [tables.html_table(a.fsdp, shown), *words]), "fsdp")


def _temporal_chart(a: RunAnalysis) -> Any:
    rows = [r for r in a.temporal if r.idle_pct is not None]
    labels = [f"rank {r.rank}" for r in rows]
    src = ColumnDataSource({"rank": labels, **{f"{p}_pct": [getattr(r, f"{p}_pct") for r in rows]
                                               for p, _ in PARTS}})
    fig = figure(height=min(900, 80 + 18 * max(1, len(rows))), sizing_mode="stretch_width",
                 y_range=FactorRange(*reversed(labels)), x_range=(0, 100),
                 tools="save", toolbar_location=None, x_axis_label="% of the rank's GPU timeline",
                 title="Where each rank's GPU time goes (HTA's temporal breakdown)")
    bars = fig.hbar_stack([f"{p}_pct" for p, _ in PARTS], y="rank", height=0.8, source=src,
                          color=[c for _, c in PARTS], legend_label=[p.replace("_", "-")
                                                                     for p, _ in PARTS])
    for bar, (p, _) in zip(bars, PARTS, strict=True):
        fig.add_tools(HoverTool(renderers=[bar], tooltips=[("", "@rank"),
                                                           (p, f"@{p}_pct{{0.0}} %")]))
    fig.ygrid.grid_line_color = None
    legend_above(fig)
    return fig


def _any_gpu(a: RunAnalysis) -> bool:
    return any(r.gpu for r in a.temporal)


def _overlap_section(a: RunAnalysis) -> Markup:
    """The overlap table by rank and collective, or why there is none."""
    if a.collective_overlap:
        body = html.join([tables.html_table(a.collective_overlap, OVERLAP),
                          html.note(OVERLAP_NOTE)])
    elif not _any_gpu(a):
        body = html.note(NO_GPU_OVERLAP)
    else:
        body = html.note("No rank's trace holds communication kernels (NCCL or RCCL): "
                         "there is no communication to overlap.")
    return section("Communication overlapped by compute", body, "overlap")


def report_parts(profile: Profile, a: RunAnalysis,
                 figures: list[Any]) -> tuple[str, list[Markup]]:
    """Summary line and sections of a run report."""
    out = []
    if a.findings:
        out.append(section("Findings", findings_html(a.findings), "findings"))
    memory = getattr(profile.payload, "memory", None)
    creeps = memory is not None and any(r.creeps for r in memory.ranks)
    if creeps:  # beside the creep's finding: its figures per rank
        out += memory_chart.sections(memory, figures)
    out += run_steps_chart.sections(getattr(profile.payload, "collected_steps", None), figures,
                                    traces=bool(getattr(profile.payload, "figures", None)))
    if not creeps:
        out += memory_chart.sections(memory, figures)
    out += run_timeline.sections(profile, a, figures)
    gpu = _any_gpu(a)
    if not gpu:
        # a CPU run: one line says what was not measured, in place of sections of n/a
        out.append(section("Not measured on this run", html.note(NOT_MEASURED),
                           "not-measured"))
    elif any(r.idle_pct is not None for r in a.temporal):
        figures.append(_temporal_chart(a))
        out.append(section("GPU time per rank", html.join(
            [html.figure_slot(len(figures) - 1), tables.html_table(a.temporal, TEMPORAL),
             html.note(NS_NOTE[0].upper() + NS_NOTE[1:] + ".")]),
            "temporal"))
    else:
        out.append(section("GPU time per rank", html.join(
            [html.note("No rank's trace holds GPU work (CPU-only traces): there is no GPU "
                       "timeline to break down."), tables.html_table(a.temporal, TEMPORAL)]),
            "temporal"))
    if a.stragglers:
        # a column no rank has a figure in (no cause found for any) is left out
        shown = [c for c in STRAGGLERS if c.key == "rank" or any(
            _filled(tables.cell_value(r, c.key)) for r in a.stragglers)]
        out.append(section("Who the others waited for (slow ranks)", html.join(
            [tables.html_table(a.stragglers, shown),
             *(html.note(n) for n in [a.evidence.get("stragglers")] if n)]), "stragglers"))
    if a.collectives:
        shown = a.collectives[:MAX_COLLECTIVE_ROWS]
        more = len(a.collectives) - len(shown)
        parts = [tables.html_table(shown, collective_columns(shown)),
                 html.note(arrived_by_note(tables.cell_value(r, "arrived_by") for r in shown))]
        if more:
            parts.append(html.note(f"{more:,} more collectives: run.collectives() or "
                                   "torchlens analyze --json list them all"))
        out.append(section("Collectives across ranks", html.join(parts), "collectives"))
    if a.step_skew:
        out.append(section("Step time across ranks", html.join(
            [tables.html_table(a.step_skew, SKEW),
             *(html.note(n) for n in [a.evidence.get("step_skew")] if n)]), "steps"))
    if gpu:
        out.append(_overlap_section(a))
    if a.fsdp:
        out.append(_fsdp_section(a))
    if gpu and a.kernels:
        out.append(section("Kernels by kind", tables.html_table(a.kernels, KERNELS), "kernels"))
    if gpu and a.idle:
        out.append(section("Idle time per stream", tables.html_table(a.idle, IDLE), "idle"))
    if gpu:
        out += launch_sections(a)
    listed = unsaid_problems(a.problems)  # a damaged manifest is its finding above
    if listed:
        out.append(section("Inputs that could not be used",
                           tables.html_table(listed, PROBLEMS), "problems"))
    return summary_line(profile, a), out
