"""The report of a ``diff`` (run B against run A): the verdict, a chart of the
largest changes, the step times, then the ops and kernels that changed.

Only draws: every figure is ``analysis.runs.diff``'s. Tables show the
changed rows (added, removed, slower, faster) first, then the small
changes, then the same ones, at most ``MAX_ROWS`` per table;
``run.diff(other).ops()`` and ``--json`` hold every row. A diff saved by an
older torchlens has no ``small`` status and no step time ``source``.
"""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, FactorRange, HoverTool
from bokeh.plotting import figure
from markupsafe import Markup

from torchlens.model import Profile
from torchlens.model.payloads import DiffRow, RunDiff
from torchlens.model.units import format_duration, format_percent
from torchlens.render import html, tables
from torchlens.render.findings import finding_html
from torchlens.render.page import section
from torchlens.render.tables import Column

MAX_ROWS = 200
CHART_ROWS = 15
COLORS = {"slower": "#d62728", "added": "#ff7f0e", "faster": "#2ca02c",
          "removed": "#17becf", "small": "#c7c7c7", "same": "#c7c7c7"}
#: the statuses the chart and the text list: changes beyond both thresholds
CHANGED = ("added", "removed", "slower", "faster")


def _calls(v: Any) -> str:
    return f"{float(v):,.2f}"


def _noise_word(within: Any) -> str:
    return "within noise" if within else "beyond noise"


#: changes are written with their sign, "+0.0 µs" included
CHANGE = [Column("delta_us", "change", lambda v: format_duration(v, signed=True)),
          Column("delta_pct", "change %", lambda v: format_percent(v, signed=True))]
ROWS = [Column("status", "status", str, False), Column("kind", "kind", str, False),
        Column("name", "name", str, False, tables.NAME_CHARS),
        Column("a_us", "A", format_duration), Column("b_us", "B", format_duration), *CHANGE,
        Column("a_calls", "calls A", _calls), Column("b_calls", "calls B", _calls)]
RANKS = [Column("rank_a", "rank in A", str), Column("rank_b", "rank in B", str),
         Column("a_median_us", "median step A", format_duration),
         Column("b_median_us", "median step B", format_duration), *CHANGE]
#: the rank table's run-to-run noise columns (a diff saved by an older torchlens has none)
NOISE = [Column("noise_us", "run-to-run noise", lambda v: "±" + format_duration(v)),
         Column("within_noise", "the change is", _noise_word, False)]


def summary_line(profile: Profile, d: RunDiff) -> str:
    return f"diff: {d.verdict}"


def text_report(profile: Profile, d: RunDiff) -> str:
    p = profile.payload
    lines = [summary_line(profile, d), f"A: {p.a}", f"B: {p.b}"]  # type: ignore[union-attr]
    lines.append(_counts(d, CHANGED + ("small",)))
    if d.step_time.regression_pct is not None:
        lines.append(_step_source(d))
    if d.step_time.within_noise:
        lines.append(_noisy_ops(d))
    per = d.per
    for r in [r for r in _changed(d.ops + d.kernels) if r.status in CHANGED][:10]:
        lines.append(f"  {r.status:<8} {r.kind:<15} {tables.shorten(r.name, 60)}: "
                     f"{format_duration(r.a_us)} -> {format_duration(r.b_us)} per {per}")
    lines += [f"note: {n}" for n in d.notes]
    return "\n".join(lines)


def _counts(d: RunDiff, statuses: tuple[str, ...]) -> str:
    s = d.summary
    return ", ".join(f"{s.get(k, 0)} {k}" for k in statuses)


def _step_source(d: RunDiff) -> str:
    """Where the step times come from, in words."""
    st = d.step_time
    if st.source == "step records":
        return (f"median step time over {st.a_steps} recorded steps of A and "
                f"{st.b_steps} of B (every recorded step of every rank: each "
                "rank's steps.jsonl)")
    return (f"median step time over {st.a_steps} profiled steps of A and "
            f"{st.b_steps} of B (the traces' ProfilerStep#N spans)")


def _noise_source(d: RunDiff) -> str:
    """How the run-to-run noise bound is made, in words (None without one)."""
    st = d.step_time
    return (f"run-to-run noise: ±{format_duration(st.noise_us)}, A's step-to-step spread "
            f"({format_duration(st.a_spread_us)}) plus B's ({format_duration(st.b_spread_us)}); "
            "a spread is 1.4826 x the median absolute deviation of a rank's step times, "
            "the median over the ranks; a change within it is what two runs of one "
            "unchanged job differ by")


def _noisy_ops(d: RunDiff) -> str:
    """Under a step time within noise: what the op and kernel rows still say."""
    return ("the step time changed within run-to-run noise, so the op and kernel rows "
            f"below are not changes: their figures per {d.per} come from the profiled "
            "steps, which carry the same noise (an op or kernel added or removed would "
            "still be named)")


def _changed(rows: list[DiffRow]) -> list[DiffRow]:
    """Changed rows (largest change first), then the small changes, then the same."""
    rows = sorted(rows, key=lambda r: -abs(r.delta_us))
    return [r for group in (CHANGED, ("small",), ("same",)) for r in rows
            if r.status in group]


def _chart(d: RunDiff) -> Any:
    rows = [r for r in _changed(d.ops + d.kernels) if r.status in CHANGED]
    rows = sorted(rows[:CHART_ROWS], key=lambda r: r.delta_us)
    labels = [f"{i + 1}. {tables.shorten(r.name, 50)}" for i, r in enumerate(rows)]
    src = ColumnDataSource({"label": labels, "delta": [r.delta_us for r in rows],
                            "name": [tables.shorten(r.name, 200) for r in rows],
                            "kind": [r.kind for r in rows],
                            "status": [r.status for r in rows],
                            "color": [COLORS[r.status] for r in rows]})
    fig = figure(height=80 + 22 * len(rows), sizing_mode="stretch_width",
                 y_range=FactorRange(*labels), tools="save", toolbar_location=None,
                 x_axis_label=f"µs per {d.per}, B - A",
                 title="The largest changes (slower and added to the right)"
                 + (": the step time changed within run-to-run noise, so the slower "
                    "and faster bars are that noise" if d.step_time.within_noise else ""))
    bars = fig.hbar(y="label", right="delta", left=0, height=0.8, color="color", source=src)
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[
        ("", "@name"), ("kind", "@kind"), ("status", "@status"), ("change", "@delta{0,0.0} µs")]))
    fig.ygrid.grid_line_color = None
    return fig


def _table(rows: list[DiffRow], what: str) -> Markup:
    ordered = _changed(rows)
    parts = [tables.html_table(ordered[:MAX_ROWS], ROWS)]
    if len(ordered) > MAX_ROWS:
        parts.append(html.note(f"{len(ordered) - MAX_ROWS:,} more {what} (unchanged or "
                               f"smaller changes): DiffResult.{what}() or --json list them all"))
    return html.join(parts)


def report_parts(profile: Profile, d: RunDiff,
                 figures: list[Any]) -> tuple[str, list[Markup]]:
    """Summary line and sections of a diff report."""
    p = profile.payload
    st, th = d.step_time, d.thresholds
    words = [f"A: {p.a}", f"B: {p.b}",  # type: ignore[union-attr]
             _counts(d, STATUS_ORDER) + f" (same: within {th.same_pct:g}%; small: "
             f"beyond {th.same_pct:g}% but within {th.same_us:g} µs per {d.per}, "
             "too little time to count; slower and faster exceed both)"]
    if st.regression_pct is not None:
        words.append(_step_source(d))
    if st.noise_us is not None:
        words.append(_noise_source(d))
    if st.within_noise:
        words.append(_noisy_ops(d))
    out = [section("Verdict", html.join([finding_html(d.verdict),
                                         *(html.note(w) for w in words + d.notes)]),
                   "verdict")]
    if any(r.status in CHANGED for r in d.ops + d.kernels):
        figures.append(_chart(d))
        out.append(section("Largest changes", html.figure_slot(len(figures) - 1), "changes"))
    if d.rank_steps:
        cols = RANKS + (NOISE if any(r.noise_us is not None for r in d.rank_steps) else [])
        out.append(section("Step time per rank", tables.html_table(d.rank_steps, cols),
                           "rank-steps"))
    if d.kernels:
        out.append(section(f"Kernels, memcpy and memset (per {d.per})",
                           _table(d.kernels, "kernels"), "kernels"))
    if d.ops:
        out.append(section(f"Host ops and annotations (per {d.per})",
                           _table(d.ops, "ops"), "ops"))
    return summary_line(profile, d), out


STATUS_ORDER = ("added", "removed", "slower", "faster", "small", "same")
