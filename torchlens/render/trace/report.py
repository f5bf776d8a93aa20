"""The ``torchprof`` / ``trace`` report: per trace, hints, ops, kernels, steps, timeline.

Draws a ``TraceAnalysis`` (``analysis.trace.analyze``); computes nothing itself.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from torchlens.analysis.trace.analyze import TraceAnalysis, TraceView
from torchlens.model import Profile
from torchlens.render import html, tables
from torchlens.render.findings import findings_html
from torchlens.render.page import section
from torchlens.render.trace.compiled import compiled_section
from torchlens.render.trace.steps_chart import build_step_chart
from torchlens.render.trace.text import problems_words, summary_line
from torchlens.render.trace.timeline import build_timeline


def trace_sections(view: TraceView, figures: list[Any], prefix: str,
                   elsewhere: str = "") -> list[Markup]:
    """Hints, ops, kernels, steps and the timeline of one trace; ``elsewhere``:
    what the sections above found (the hints' empty line points to it)."""
    empty = "No known problem found in this trace." + (
        f" Above: {elsewhere}." if elsewhere else "")
    out = [
        section(f"{prefix}Hints", findings_html(view.hints, empty), f"hints-{view.key}"),
        section(f"{prefix}Ops", tables.op_table_html(view.ops, view.top_ops, view.display,
                                                       view.has_gpu), f"ops-{view.key}"),
    ]
    if view.has_gpu and len(view.kernels):
        out.append(section(f"{prefix}GPU kernels",
                           tables.kernel_table_html(view.kernels, view.display.top),
                           f"kernels-{view.key}"))
    if len(view.steps):
        chart = build_step_chart(view.steps, view.has_gpu, f"{prefix}Step breakdown".strip())
        slot = html.figure_slot(len(figures))
        figures.append(chart)
        out.append(section(f"{prefix}Step breakdown",
                           tables.step_table_html(view.steps, view.has_gpu, slot),
                           f"steps-{view.key}"))
    fig, drawn = build_timeline(view.trace, title=f"{prefix}Timeline".strip())
    if fig is None:
        body = html.note("This trace has no timed events to draw.")
    else:
        body = html.figure_slot(len(figures))
        figures.append(fig)
        if drawn.not_drawn:
            body = html.join([body, html.note(drawn.not_drawn_words)])
    out.append(section(f"{prefix}Timeline", body, f"timeline-{view.key}"))
    if view.not_understood:
        out.append(section(f"{prefix}Not understood", html.join(
            [html.note(text) for text in view.not_understood]), f"not-understood-{view.key}"))
    return out


def report_parts(profile: Profile, analysis: TraceAnalysis,
                 figures: list[Any]) -> tuple[str, list[Markup]]:
    """Summary line and sections of a torchprof or trace report."""
    parts: list[Markup] = []
    if analysis.compiled is not None:
        parts.append(section("Compiled code (torch.compile)",
                             compiled_section(analysis.compiled), "compiled"))
    if analysis.scaler is not None:
        parts.append(section("Mixed precision (GradScaler)", html.join(
            [findings_html(analysis.scaler_findings, "No optimizer step skipped."),
             html.note(analysis.scaler_words)]), "scaler"))
    for view in analysis.views:
        prefix = f"{view.key}: " if len(analysis.views) > 1 else ""
        parts += trace_sections(view, figures, prefix, problems_words(analysis))
    if not analysis.views:
        parts.append(html.note("This profile holds no trace."))
    return summary_line(profile, analysis), parts
