"""The %ddp_check report: checklist, per-rank figures and tables, stacks, logs.

Draws a ``DdpAnalysis`` (``analysis.ddp.analyze``), so a saved ``.tlprof``
renders the same report on a machine without torch. Every string from the
workers (file paths, exception messages, stacks, logs) is escaped by the
templates (``render.html``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from markupsafe import Markup

from torchlens.analysis.ddp.analyze import DdpAnalysis
from torchlens.analysis.ranks.steps import rank_table
from torchlens.model import DdpRun, Profile
from torchlens.model.payloads import RankProfiling
from torchlens.model.units import (
    format_bytes,
    format_count,
    format_duration,
    format_ms,
    format_percent,
    plural,
)
from torchlens.render import html, tables
from torchlens.render.ddp.heartbeats import rank_figures
from torchlens.render.findings import finding_text, findings_html
from torchlens.render.fsdp import FSDP_COLUMNS  # only when a rank used FSDP
from torchlens.render.page import section
from torchlens.render.ranks.view import rank_profile_figures
from torchlens.render.tables import Column

RANK_COLUMNS = [Column("rank", "rank", str), Column("pid", "pid", str),
                Column("device", "device", str, False), Column("exit", "exit", str, False),
                Column("collectives", "collectives", format_count),
                Column("steps_s", "step time", lambda v: format_duration(v * 1e6)),
                Column("rss", "peak RSS", format_bytes),
                Column("tensor", "peak tensor bytes", format_bytes),
                Column("error", "error", str, False)]
COLLECTIVE_COLUMNS = [Column("rank", "rank", str), Column("index", "#", str),
                      Column("op", "op", str, False), Column("tensors", "tensors", str, False),
                      Column("line", "issued at", str, False),
                      Column("call_ms", "call", lambda v: format_duration(v * 1e3))]


def _pre_blocks(title: str, texts: list[str]) -> Markup:
    """A folded ``<pre>`` per rank with text under ``title``; nothing if none has."""
    blocks = [(r, t) for r, t in enumerate(texts) if t]
    return html.render("pre_blocks.html.j2", title=title, blocks=blocks) if blocks else Markup("")


#: how the per-rank table shows the keys ``rank_table`` is known to return;
#: any other key is shown by its suffix (``_ms``, ``_pct``, bytes) or as text
RANK_TABLE_KEYS = {"rank": "rank", "steps": "steps", "step_ms": "median step",
                   "profiled": "profiled steps"}
_BYTES = ("allocated", "reserved", "rss", "inactive_split", "largest_free", "bytes")


def _rank_table_column(key: str, values: list[Any]) -> Column:
    label = RANK_TABLE_KEYS.get(key) or key.removesuffix("_ms").removesuffix("_pct").replace(
        "_", " ")
    present = [v for v in values if v is not None]
    if not present or not all(isinstance(v, (int, float)) for v in present):
        return Column(key, label, str, False)
    if key.endswith("_ms"):
        return Column(key, label, format_ms)
    if key.endswith("_pct"):
        return Column(key, label, format_percent)
    if key == "frag" or key.endswith("_frag"):  # a share (0..1)
        return Column(key, label, lambda v: format_percent(100 * v))
    if any(key.endswith(b) for b in _BYTES):
        return Column(key, label, format_bytes)
    if all(isinstance(v, int) for v in present):
        return Column(key, label, format_count)
    return Column(key, label, lambda v: f"{v:,.3g}")


def _memory_key(key: str) -> bool:
    return key in ("frag", "source") or key.endswith("_frag") or key.endswith(_BYTES)


def rank_table_html(rows: list[dict[str, Any]]) -> Markup:
    """``analysis.ranks.steps.rank_table`` as sortable tables, one row per rank:
    the times, then the memory (one table of 17 columns was 1310 px wide and
    scrolled in a box of its own beside the notebook's sidebar)."""
    keys = list(dict.fromkeys(k for row in rows for k in row))
    memory = [k for k in keys if _memory_key(k)]
    # the resident set apart from the allocator: ten memory columns were 714 px,
    # cut at a 650 px notebook output ("so…")
    resident = [k for k in memory if k.endswith("rss")]
    allocator = [k for k in memory if k not in resident]
    groups = [[k for k in keys if not _memory_key(k)],
              *(["rank", *part] for part in (allocator, resident) if part)]
    return html.join([tables.html_table(rows, [_rank_table_column(k, [row.get(k) for row in rows])
                                               for k in group], "tight")
                      for group in groups if group])


def _ended(run: DdpRun, a: DdpAnalysis) -> tuple[dict[int, str], dict[int, float]]:
    """Ranks that stopped early: why (rank -> words) and when (rank -> unix s)."""
    reasons: dict[int, str] = {}
    times: dict[int, float] = {}
    for row in a.rank_rows:
        r = row.rank
        exit_ = row.exit or ""
        if not row.error and exit_ in ("", "0"):
            continue
        reasons[r] = row.error or ("killed" if exit_ == "killed" else f"exit code {exit_}")
        res = run.ranks[r] if r < len(run.ranks) else None
        raised = res.error.t if res is not None and res.error is not None else None
        t = raised or (run.ended_at[r] if r < len(run.ended_at) else None)
        if t is not None:
            times[r] = float(t)
    return reasons, times


def _profiling_html(run: DdpRun, prof: RankProfiling, a: DdpAnalysis,
                    figures: list[Any]) -> Markup:
    reasons, times = _ended(run, a)
    figures.append(rank_profile_figures(prof, run.world_size or 1, run.t0, reasons, times))
    unit = "window" if prof.windows else "step"
    notes = [f"One {unit} in {prof.every} of each rank ran under torch.profiler"
             + (f"; raw traces in {prof.run_dir}." if prof.run_dir else ".")]
    if prof.windows:
        notes.append(f"The function never called torchlens.step() and no optimizer stepped: "
                     f"{unit}s are fixed windows of {prof.window_s:g} s.")
    elif prof.steps_by.startswith("optimizer"):
        notes.append(f"The function never called torchlens.step(): steps end at each "
                     f"{prof.steps_by}.")
    if any((s.get("memory") or {}).get("source") == "modelled"
           for sums in prof.summaries for s in sums):
        notes.append("CPU run: allocated, reserved and fragmentation are modelled, what a "
                     "CUDA caching allocator would hold for the same requests.")
    dropped = sum(prof.dropped_summaries or [])
    if dropped:
        older = plural(dropped, "older summary", "older summaries")
        notes.append(f"The timeline and table read the newest {prof.keep} profiled "
                     f"{unit}s of each rank ({older} left out; their traces are kept).")
    table = rank_table(prof.steps, prof.summaries)
    return html.join([html.figure_slot(len(figures) - 1), *(html.note(n) for n in notes),
                      rank_table_html(table)])


def sections(profile: Profile, a: DdpAnalysis, figures: list[Any]) -> list[tuple[str, Markup, str]]:
    """(title, body, anchor) of each report section."""
    run = a.run
    out = [("Checklist", findings_html(a.checklist), "checklist")]
    extra = _pre_blocks("Python stack of each rank when the hang was detected:",
                        run.hang.stacks if run.hang is not None else [])
    crash = a.item("crashed worker")
    if crash and crash.severity == "failed" and crash.details.get("traceback"):
        extra += html.render("pre.html.j2", title="Traceback of the first failing rank:",
                             text=crash.details["traceback"])
    if extra:
        out.append(("Stacks and tracebacks", extra, "stacks"))
    if run.profiling is not None:
        out.append(("Per-rank steps, memory and timeline (--profile)",
                    _profiling_html(run, run.profiling, a, figures), "rank-profile"))
    if a.heartbeats:
        figures.append(rank_figures(a.heartbeats, run.world_size or 1, run.fingerprints, run.t0))
        counted = any(hb.collectives for hb in a.heartbeats) or any(run.fingerprints or [])
        out.append(("Per-rank memory, collectives and timeline" if counted else
                    "Per-rank memory and timeline",
                    html.figure_slot(len(figures) - 1), "ranks-plot"))
    rank_cells = [row.cells() for row in a.rank_rows]
    fsdp = [c for c in FSDP_COLUMNS if any(row.get(c.key) is not None for row in rank_cells)]
    out.append(("Ranks", tables.html_table(rank_cells, RANK_COLUMNS[:-1] + fsdp
                                           + RANK_COLUMNS[-1:]), "ranks"))
    if a.collective_rows:
        out.append(("Collectives", tables.html_table(
            [dataclasses.asdict(row) for row in a.collective_rows], COLLECTIVE_COLUMNS),
            "collectives"))
    logs = [res.log if res is not None else "" for res in run.ranks]
    if any(logs):
        out.append(("Worker output", _pre_blocks("Last lines each rank printed:", logs), "logs"))
    out.append(("Environment (kernel)", tables.environment_html(profile.environment),
                "environment"))
    return out


def summary_line(profile: Profile, a: DdpAnalysis) -> str:
    return a.summary


def text_report(profile: Profile, a: DdpAnalysis) -> str:
    """The text/plain view: summary and one line per check."""
    lines = [a.summary]
    lines += [finding_text(it) for it in a.checklist]
    return "\n".join(lines)


def report_parts(profile: Profile, a: DdpAnalysis,
                 figures: list[Any]) -> tuple[str, list[Markup]]:
    """Summary line and sections of a ddp_check report."""
    return a.summary, [section(t, body, anchor) for t, body, anchor in sections(profile, a, figures)]
