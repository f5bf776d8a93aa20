"""The run report's chart of every step over time (``torchlens run`` folders).

Draws ``analysis.ranks.series.step_series`` as it is: x is the end of each step
in seconds since the collector started, y its time in ms, one colour per
rank. A rank's steps before a restart by the elastic agent are dashed and
pale with hollow points, its last start solid, so the two starts cannot be
mistaken for one run; each restart is a red line where the old workers stopped, a pale band
until the new ones stepped again, and its label (the findings above the
chart say each restart in full).

A step the loss scaler skipped the optimizer step of, or that recompiled, is
marked on its rank's line (an x, a star; in the legend): the step was taken
and is on the line too, the mark says what happened in it.

A span a framework labelled (the Hugging Face Trainer's ``evaluation`` and
``checkpoint``) is no step: a marker of its own per label, in the legend,
and not on the rank's step line (an evaluation of seconds there read as a
spike of the training, a short one as a dip).
"""

from __future__ import annotations

from typing import Any

from bokeh.models import BoxAnnotation, ColumnDataSource, HoverTool, Label, Span
from bokeh.plotting import figure
from markupsafe import Markup

from torchlens.analysis.ranks.series import RECOMPILED, SKIPPED
from torchlens.model.payloads import RankSeries, StepSeries
from torchlens.render import html
from torchlens.render.columns import rank_color
from torchlens.render.page import section
from torchlens.render.step_axis import CappedAxis, robust_top

RESTART_COLOR = "#b00"
#: ranks named in the legend (more make it taller than the chart)
LEGEND_RANKS = 16


#: marker and fill of each labelled span (``StepRecord.label``); others: the last
SPAN_MARKS = {"evaluation": ("diamond", "#6a3d9a"), "checkpoint": ("square", "#222222"),
              None: ("triangle", "#555555")}


def span_labels(series: StepSeries) -> list[str]:
    """The labels of the labelled spans, evaluation and checkpoint first."""
    seen = {lab for cols in series.ranks.values() for lab in cols.labelled.label}
    known = [k for k in SPAN_MARKS if k in seen]
    return known + sorted(seen - set(known))


def _points(ranks: dict[int, RankSeries], columns: str, field: str, value: str
            ) -> dict[str, list[Any]]:
    """The points of every rank's ``columns`` (``labelled`` or ``marked``) whose
    ``field`` (``label`` or ``mark``) is ``value``: time, ms, step, rank, the
    value itself and the rank's colour."""
    pts: dict[str, list[Any]] = {k: [] for k in ("t", "ms", "rank", "step", field, "color")}
    for r, cols in sorted(ranks.items()):
        c = getattr(cols, columns)
        for i, v in enumerate(getattr(c, field)):
            if v == value:
                pts["t"].append(c.t[i])
                pts["ms"].append(c.ms[i])
                pts["step"].append(c.step[i])
                pts["rank"].append(r)
                pts[field].append(v)
                pts["color"].append(rank_color(r))
    return pts


def _spans(fig: Any, ranks: dict[int, RankSeries], labels: list[str]) -> list[Any]:
    """One marker per labelled span, a legend entry per label; their renderers."""
    out = []
    for label in labels:
        pts = _points(ranks, "labelled", "label", label)
        marker, fill = SPAN_MARKS.get(label, SPAN_MARKS[None])
        out.append(fig.scatter("t", "ms", source=ColumnDataSource(pts), marker=marker, size=10,
                               fill_color=fill, line_color="color", line_width=1.5,
                               legend_label=f"{label} (not a step)"))
    return out


#: marker and colour of each marked step (``analysis.ranks.series.MARKS``)
STEP_MARKS = {SKIPPED: ("x", "#d62728"), RECOMPILED: ("star", "#ff7f0e")}


def _marks(fig: Any, ranks: dict[int, RankSeries]) -> list[Any]:
    """One marker per marked step, a legend entry per kind of mark; their renderers."""
    out = []
    for mark, (marker, colour) in STEP_MARKS.items():
        pts = _points(ranks, "marked", "mark", mark)
        pts["y"] = list(pts["ms"])  # at the axis' top when above it (steps_figure)
        if pts["t"]:
            out.append(fig.scatter("t", "y", source=ColumnDataSource(pts), marker=marker,
                                   size=11, line_color=colour, fill_color=colour,
                                   line_width=2, legend_label=mark))
    return out


def _start(restart: int) -> str:
    return "first start" if restart == 0 else f"after restart {restart}"


def steps_figure(series: StepSeries) -> Any:
    """The figure, or None when no rank has a step."""
    ranks = {int(r): cols for r, cols in series.ranks.items() if cols.t or cols.labelled.t}
    if not ranks:
        return None
    lines: dict[bool, dict[str, list[Any]]] = {
        last: {"xs": [], "ys": [], "color": [], "rank": []} for last in (True, False)}
    points: dict[str, list[Any]] = {k: [] for k in ("t", "ms", "rank", "step", "start",
                                                    "color", "fill")}
    for r, cols in sorted(ranks.items()):
        final = max(cols.restart, default=0)
        for start in sorted(set(cols.restart)):
            idx = [i for i, s in enumerate(cols.restart) if s == start]
            line = lines[start == final]
            line["xs"].append([cols.t[i] for i in idx])
            line["ys"].append([cols.ms[i] for i in idx])
            line["color"].append(rank_color(r))
            line["rank"].append(f"rank {r}")
        points["t"] += cols.t
        points["ms"] += cols.ms
        points["rank"] += [r] * len(cols.t)
        points["step"] += cols.step
        points["start"] += [_start(s) for s in cols.restart]
        points["color"] += [rank_color(r)] * len(cols.t)
        # hollow before the restart: a short first start is a few points, too
        # close together for its dashed line to show
        points["fill"] += [rank_color(r) if s == final else "white" for s in cols.restart]
    fig = figure(height=300, sizing_mode="stretch_width", tools="xpan,xwheel_zoom,box_zoom,reset,save",
                 active_scroll="xwheel_zoom", x_axis_label=f"s since {series.since or 'torchlens run started'}",
                 y_axis_label="ms per step", output_backend="webgl",
                 title="Every step of every rank over time"
                       + ("; red: restarts by the elastic agent" if series.restarts
                          else ""))
    named = len(ranks) <= LEGEND_RANKS
    fig.multi_line("xs", "ys", source=ColumnDataSource(lines[True]), color="color",
                   line_width=1.5, **({"legend_field": "rank"} if named else {}))
    if lines[False]["xs"]:
        fig.multi_line("xs", "ys", source=ColumnDataSource(lines[False]), color="color",
                       line_width=1.5, line_alpha=0.45, line_dash="dashed",
                       legend_label="before a restart (dashed)")
    dots = fig.scatter("t", "ms", source=ColumnDataSource(points), line_color="color",
                       fill_color="fill", size=4)
    fig.add_tools(HoverTool(renderers=[dots], tooltips=[
        ("rank", "@rank"), ("step", "@step"), ("step time", "@ms{0,0.0} ms"),
        ("start", "@start"), ("ended at", "@t{0,0.0} s")]))
    spans = _spans(fig, ranks, span_labels(series))
    if spans:
        fig.add_tools(HoverTool(renderers=spans, tooltips=[
            ("", "@label (not a training step)"), ("rank", "@rank"), ("after step", "@step"),
            ("took", "@ms{0,0.0} ms"), ("ended at", "@t{0,0.0} s")]))
    marks = _marks(fig, ranks)
    if marks:
        fig.add_tools(HoverTool(renderers=marks, tooltips=[
            ("", "@mark"), ("rank", "@rank"), ("step", "@step"), ("step time", "@ms{0,0.0} ms"),
            ("ended at", "@t{0,0.0} s")]))
    span_ms = [m for s in spans for m in s.data_source.data["ms"]]
    # the labels at the axis' top, which a spike's point may be above
    top = robust_top(points["ms"], points["rank"]) or max([*points["ms"], *span_ms])
    for r in series.restarts:
        if r.t is None:
            continue
        if r.resumed is not None and r.resumed > r.t:
            fig.add_layout(BoxAnnotation(left=r.t, right=r.resumed, fill_color=RESTART_COLOR,
                                         fill_alpha=0.08, line_alpha=0))
        fig.add_layout(Span(location=r.t, dimension="height", line_color=RESTART_COLOR,
                            line_width=2, line_dash="dashed"))
        fig.add_layout(Label(x=r.t, y=top, text=r.label, text_color=RESTART_COLOR,
                             text_font_size="9pt", x_offset=4, text_baseline="top",
                             background_fill_color="white", background_fill_alpha=0.7))
    fig.y_range.start = 0
    axis = CappedAxis(fig)
    axis.update(points["t"], points["ms"],  # one spike does not flatten the rest
                [f"step {s} (rank {r})" for s, r in zip(points["step"], points["rank"],
                                                        strict=True)],
                points["rank"])
    if axis.top is not None:  # a marked step above the axis is marked at its top
        for r in marks:
            r.data_source.data["y"] = [min(y, axis.top) for y in r.data_source.data["ms"]]
    if fig.legend:
        fig.legend.orientation = "horizontal"
        fig.legend.label_text_font_size = "8pt"
        fig.legend.click_policy = "hide"
        fig.add_layout(fig.legend[0], "above")
    return fig


def sections(series: StepSeries | None, figures: list[Any], traces: bool = True
             ) -> list[Markup]:
    """The chart's section (nothing for a folder ``torchlens run`` did not write);
    ``traces``: the folder has traces of profiled steps (drawn below it)."""
    fig = steps_figure(series) if series is not None else None
    if fig is None or series is None:
        return []
    figures.append(fig)
    ranks = len(series.ranks)
    what = (f"{series.steps:,} step records of {ranks} rank{'s' if ranks != 1 else ''}, "
            "as the ranks sent them" + (" (the traces below hold only the profiled "
                                                 "steps)" if traces else ""))
    if series.drawn < series.steps:
        what += (f"; drawn as {series.drawn:,} points, each rank's slowest step per time "
                 "bin")
    labels = span_labels(series)
    if labels:
        n = series.labelled or sum(len(c.labelled.t) for c in series.ranks.values())
        what += (f"; {n:,} {' and '.join(labels)} span{'s' if n != 1 else ''} (a "
                 "framework's labels, e.g. the Hugging Face Trainer's): markers of their own, "
                 "left out of the step lines")
    if series.marked:
        kinds = sorted({k for c in series.ranks.values() for k in c.marked.mark})
        what += (f"; {series.marked:,} step{'s' if series.marked != 1 else ''} marked "
                 f"({', '.join(kinds)})")
        if series.marks_left_off:
            what += f", {series.marks_left_off:,} more not marked (the first kept per rank)"
    if series.restarts:  # the sentences themselves lead the findings
        what += ("; dashed lines and hollow points: a rank's steps before a restart, red: "
                 "the restarts (the band: until the new workers stepped again)")
    parts = [html.note(what + "."), html.figure_slot(len(figures) - 1)]
    return [section("Every step over time", html.join(parts), "steps-over-time")]
