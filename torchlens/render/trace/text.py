"""Plain-text views: the one-line summary and the text/plain report.

The text report is what a terminal, a plain-text notebook viewer or a log sees
when HTML cannot be shown, so it carries the same summary and top ops as the
HTML report, as fixed-width columns.
"""

from __future__ import annotations

from torchlens.analysis.trace.analyze import TraceAnalysis, TraceView
from torchlens.model import Profile
from torchlens.model.units import format_duration, format_percent, plural
from torchlens.render import tables
from torchlens.render.findings import finding_text
from torchlens.render.trace.compiled import compiled_text


def summary_line(profile: Profile, analysis: TraceAnalysis) -> str:
    """One line: wall time, events, profiler overhead, top op."""
    s = analysis.summary
    parts = [f"wall {format_duration(s.wall_us)}", plural(s.n_events, "event"),
             f"profiler start/stop {format_duration(s.profiler_overhead_us)}"]
    if s.top_op:
        parts.append(f"top op {s.top_op} ({format_percent(100 * s.top_op_share)} of self CPU)")
    if not s.gpu_present:
        parts.append("CPU only")
    if profile.error:
        parts.append(f"cell raised {profile.error.get('type', 'an exception')}")
    found = problems_words(analysis)
    return "torchlens: " + ", ".join(parts) + (f"; {found}" if found else "")


def problems_words(analysis: TraceAnalysis) -> str:
    """What the compiled code and the loss scaler found, in a few words for the
    first line ("" when nothing): the sections below say each in full."""
    out = []
    c = analysis.compiled
    if c is not None:
        if c.breaks:
            out.append(plural(len(c.breaks), "graph break"))
        if c.recompiles:
            out.append(plural(len(c.recompiles), "recompile"))
        if c.failed:
            out.append(plural(len(c.failed), "failed compile"))
    s = analysis.scaler
    if s is not None and s.total_skipped:
        out.append(f"{s.total_skipped} of {plural(s.total_steps, 'optimizer step')} "
                   "skipped by GradScaler")
    return ", ".join(out)


def _fixed_width(rows: list[list[str]], numeric: list[bool]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric, strict=True)]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


_MAX_NAME = 60  # long templated op names would push the numbers off screen


def op_table_text(view: TraceView) -> list[str]:
    """The top ops as fixed-width text, the same rows and order as the HTML."""
    shown = view.top_ops
    if len(shown) == 0:
        return ["(no ops in this trace)"]
    cols = [c for c in tables.op_columns(view.display, view.has_gpu) if c.key in shown.columns]
    rows = [[c.label for c in cols]]
    for rec in shown.to_dict("records"):
        cells = []
        for c in cols:
            text = tables.cell_text(c, rec.get(c.key))
            if len(text) > _MAX_NAME:
                text = text[: _MAX_NAME - 1] + "…"
            cells.append(text)
        rows.append(cells)
    return _fixed_width(rows, [c.numeric for c in cols])


def text_report(profile: Profile, analysis: TraceAnalysis) -> str:
    """The text/plain fallback: summary, then each trace's top ops."""
    lines = [summary_line(profile, analysis)]
    if analysis.compiled is not None:
        lines += compiled_text(analysis.compiled)
    if analysis.scaler is not None:
        lines.append(analysis.scaler_words)
        lines += [f"  {finding_text(f)}" for f in analysis.scaler_findings]
    views = analysis.views
    for view in views:
        lines.append("")
        if len(views) > 1:
            lines.append(f"[{view.key}]")
        lines += op_table_text(view)
        lines += [f"not understood: {text}" for text in view.not_understood]
    for item in profile.unmeasured:
        lines.append(f"not measured: {item}")
    return "\n".join(lines)
