"""The %ddp_check report: checklist, per-rank figures and tables, stacks, logs.

Draws a ``DdpAnalysis`` (``analysis.ddp_run``), so a saved ``.tlprof``
renders the same report on a machine without torch. Every string from the
workers (file paths, exception messages, stacks, logs) is escaped by the
templates (``render.html``).
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from ..analysis import ddp as ddp_analysis
from ..analysis.ddp_run import DdpAnalysis
from ..model import Profile
from . import html, tables
from .live import rank_figures
from .report import section
from .tables import Column

_STATUS_STYLE = {"passed": "color:#1a7f37", "failed": "color:#b00;font-weight:600",
                 "not applicable": "color:#777"}


def checklist_html(items: list[ddp_analysis.CheckItem]) -> Markup:
    return html.render("checklist.html.j2", items=items, styles=_STATUS_STYLE)


RANK_COLUMNS = [Column("rank", "rank", str), Column("pid", "pid", str),
                Column("device", "device", str, False), Column("exit", "exit", str, False),
                Column("collectives", "collectives", tables.fmt_int),
                Column("steps_s", "step time", lambda v: f"{v:.3f} s"),
                Column("rss", "peak RSS", ddp_analysis.format_bytes),
                Column("tensor", "peak tensor bytes", ddp_analysis.format_bytes),
                Column("error", "error", str, False)]
COLLECTIVE_COLUMNS = [Column("rank", "rank", str), Column("index", "#", str),
                      Column("op", "op", str, False), Column("tensors", "tensors", str, False),
                      Column("line", "issued at", str, False),
                      Column("call_ms", "call", lambda v: f"{v:.3f} ms")]


def _pre_blocks(title: str, texts: list[str]) -> Markup:
    """A folded ``<pre>`` per rank with text under ``title``; nothing if none has."""
    blocks = [(r, t) for r, t in enumerate(texts) if t]
    return html.render("pre_blocks.html.j2", title=title, blocks=blocks) if blocks else Markup("")


def sections(profile: Profile, a: DdpAnalysis, figures: list[Any]) -> list[tuple[str, Markup, str]]:
    """(title, body, anchor) of each report section."""
    run = a.run
    out = [("Checklist", checklist_html(a.checklist), "checklist")]
    hang = run.hang or {}
    extra = _pre_blocks("Python stack of each rank when the hang was detected:",
                        hang.get("stacks") or [])
    crash = a.item("crashed worker")
    if crash and crash.status == "failed" and crash.details.get("traceback"):
        extra += html.render("pre.html.j2", title="Traceback of the first failing rank:",
                             text=crash.details["traceback"])
    if extra:
        out.append(("Stacks and tracebacks", extra, "stacks"))
    if a.heartbeats:
        figures.append(rank_figures(a.heartbeats, run.world_size or 1, run.fingerprints, run.t0))
        out.append(("Per-rank memory, collectives and timeline",
                    html.figure_slot(len(figures) - 1), "ranks-plot"))
    out.append(("Ranks", tables.html_table(a.rank_rows, RANK_COLUMNS), "ranks"))
    if a.collective_rows:
        out.append(("Collectives", tables.html_table(a.collective_rows, COLLECTIVE_COLUMNS),
                    "collectives"))
    logs = [(res or {}).get("log", "") for res in run.ranks]
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
    for it in a.checklist:
        lines.append(f"[{it.status}] {it.name}: {it.evidence}")
        if it.status == "failed" and it.advice:
            lines.append(f"    what to do: {it.advice}")
    return "\n".join(lines)


def report_parts(profile: Profile, a: DdpAnalysis,
                 figures: list[Any]) -> tuple[str, list[Markup]]:
    """Summary line and sections of a ddp_check report."""
    return a.summary, [section(t, body, anchor) for t, body, anchor in sections(profile, a, figures)]
