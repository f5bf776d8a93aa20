"""The run report's joint timeline (a lane group per rank, its streams inside)
and its clock table.

What is drawn: the bounded lane summaries each worker kept
(``analysis.runs.lanes``) on one time axis, every rank's times moved by
its applied clock offset (``analysis.runs.clock``). y is ``(rank,
lane)`` nested factors, so each rank is a group; x is ms from the run's first
drawn event. Events are bars coloured by kind; collectives carry the key
``trace:seq``, and tapping one selects the same collective on every rank
(a ``CustomJS`` on the one ``ColumnDataSource``: it works in a saved file
without a server). The hover names the op, rank, lane and duration.

Why it stays small at any world size: at most ``MAX_BARS`` event bars are
drawn over the whole run; each (rank, lane) gets an equal share of them, its
longest events first (collectives are always drawn, bounded per trace by
``lanes.MAX_COLLECTIVES``). What is not drawn shows as grey busy bars (one
per bin and lane, darker = busier), so work is never hidden, only merged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, CustomJS, FactorRange, HoverTool, TapTool
from bokeh.plotting import figure
from markupsafe import Markup

from torchlens.analysis.runs.analyze import RunAnalysis
from torchlens.analysis.runs.clock import alignment_words, applied_offsets, run_skew
from torchlens.analysis.runs.lanes import BINS, COLLECTIVES_LANE, KINDS
from torchlens.model import Profile
from torchlens.model.run_figures import LaneSummary
from torchlens.model.units import format_count, format_duration, format_us
from torchlens.render import html, tables
from torchlens.render.legend import add_colour_legend
from torchlens.render.page import section
from torchlens.render.tables import Column

#: event bars drawn over the whole run (the rest become busy bars)
MAX_BARS = 24_000
#: fewest bars a (rank, lane) keeps however many ranks there are
MIN_PER_LANE = 8
ROW_PX = 18
COLORS = {"compute": "#0072B2", "communication": "#D55E00", "memory": "#E69F00",
          "cpu": "#009E73", "other": "#999999"}
BUSY_COLOR = "#7f7f7f"
BUSY_LABEL = "merged shorter events (darker = busier)"

#: select every bar with the tapped bars' collective keys, on every rank
TAP_JS = """
const sel = src.selected.indices;
if (sel.length === 0) return;
const key = src.data.key;
const picked = new Set();
for (const i of sel) if (key[i]) picked.add(key[i]);
if (picked.size === 0) return;
const all = [];
for (let i = 0; i < key.length; i++) if (picked.has(key[i])) all.push(i);
if (all.length !== sel.length) src.selected.indices = all;
"""


CLOCKS = [Column("rank", "rank", str), Column("host", "host", lambda v: v or "", False),
          Column("offset_us", "clock offset", format_duration),
          Column("collectives", "collectives used", format_count),
          Column("residual_median_us", "residual (median)", format_us),
          Column("residual_max_us", "residual (max)", format_us),
          Column("applied", "applied", lambda v: "yes" if v else "no", False)]


def timeline_source(profile: Profile, a: RunAnalysis) -> tuple[dict[str, list], dict[str, list],
                                                               list[tuple[str, str]], int]:
    """Columns of the event bars and the busy bars, the (rank, lane) factors
    top-down, and how many events were merged into busy bars."""
    figures = {int(r): f for r, f in profile.payload.figures.items()}  # type: ignore[union-attr]
    offsets = applied_offsets(a.clocks)
    per_rank: dict[int, list[tuple[int, LaneSummary]]] = {
        r: [(f.place(i), f.lanes) for i, f in enumerate(fs) if isinstance(f.lanes, LaneSummary)]
        for r, fs in sorted(figures.items())}
    factors: list[tuple[str, str]] = []
    for r, fs in per_rank.items():
        names: list[str] = []
        for _, lanes in fs:
            names += [n for n in lanes.lanes if n not in names]
        # the collectives lane last in each group, whichever trace added lanes after it
        names.sort(key=lambda n: n == COLLECTIVES_LANE)
        factors += [(f"rank {r}", n) for n in names]
    quota = max(MIN_PER_LANE, MAX_BARS // max(1, len(factors)))
    # the run's time zero: the earliest aligned trace start
    starts = [s.origin_s - offsets.get(r, 0.0) / 1e6 + s.span_us[0] / 1e6
              for r, fs in per_rank.items() for _, s in fs]
    zero_s = min(starts) if starts else 0.0
    ev: dict[str, list] = {k: [] for k in ("y", "left", "right", "color", "name", "rank",
                                           "lane", "dur", "kind", "key")}
    busy: dict[str, list] = {k: [] for k in ("y", "left", "right", "alpha")}
    merged = 0
    for r, fs in per_rank.items():
        for trace, s in fs:
            shift_ms = (s.origin_s - offsets.get(r, 0.0) / 1e6 - zero_s) * 1e3
            lane_of = s.lanes
            t, d = np.asarray(s.t, float), np.asarray(s.d, float)
            lane, seq = np.asarray(s.lane, int), np.asarray(s.seq, int)
            draw = seq >= 0
            for li in range(len(lane_of)):
                mine = np.flatnonzero((lane == li) & (seq < 0))
                draw[mine[np.argsort(-d[mine], kind="stable")[:quota]]] = True
            bins = {(lane_of[li], b): sh for li, b, sh in zip(
                s.busy.lane, s.busy.bin, s.busy.share, strict=True)}
            bin_us, start_us = s.bin_us, s.span_us[0]
            for j in np.flatnonzero(~draw):
                k = (lane_of[lane[j]], int(min((t[j] - start_us) // bin_us, BINS - 1)))
                bins[k] = min(1.0, bins.get(k, 0.0) + d[j] / bin_us)
                merged += 1
            for j in np.flatnonzero(draw):
                kind = KINDS[s.kind[j]]
                ev["y"].append((f"rank {r}", lane_of[lane[j]]))
                ev["left"].append(shift_ms + t[j] / 1e3)
                ev["right"].append(shift_ms + (t[j] + d[j]) / 1e3)
                ev["color"].append(COLORS[kind])
                ev["name"].append(s.names[s.name[j]])
                ev["rank"].append(r)
                ev["lane"].append(lane_of[lane[j]])
                ev["dur"].append(format_duration(d[j]))
                ev["kind"].append(kind)
                ev["key"].append(f"{trace}:{seq[j]}" if seq[j] >= 0 else "")
            # the worker already merged the events it did not keep
            real = [li for li, n in enumerate(lane_of) if n != COLLECTIVES_LANE]
            merged += s.events - int(np.isin(lane, real).sum())
            for (ln, b), sh in bins.items():
                busy["y"].append((f"rank {r}", ln))
                busy["left"].append(shift_ms + (start_us + b * bin_us) / 1e3)
                busy["right"].append(shift_ms + (start_us + (b + 1) * bin_us) / 1e3)
                busy["alpha"].append(round(0.15 + 0.6 * sh, 3))
    return ev, busy, factors, merged


def timeline_figure(profile: Profile, a: RunAnalysis) -> tuple[Any, str] | None:
    """The joint timeline and the line that says what it shows; ``None`` when
    no rank kept a lane summary."""
    ev, busy, factors, merged = timeline_source(profile, a)
    if not factors:
        return None
    src = ColumnDataSource(ev, name="run-timeline-events")
    busy_src = ColumnDataSource(busy, name="run-timeline-busy")
    fig = figure(height=min(30_000, 120 + ROW_PX * len(factors)), sizing_mode="stretch_width",
                 y_range=FactorRange(*reversed(factors), group_padding=0.6),
                 tools="xpan,xwheel_zoom,box_zoom,reset,save", active_scroll="xwheel_zoom",
                 x_axis_label=f"ms from the run's first event ({alignment_words(a.clocks)})",
                 title="Every rank on one timeline: tap a collective to see it on every rank",
                 name="run-timeline", output_backend="webgl")
    fig.hbar(y="y", left="left", right="right", height=0.7, source=busy_src, color=BUSY_COLOR,
             alpha="alpha", line_alpha=0)
    bars = fig.hbar(y="y", left="left", right="right", height=0.8, source=src, color="color",
                    line_color=None, selection_line_color="black",
                    selection_fill_alpha=1.0, nonselection_fill_alpha=0.35,
                    nonselection_line_alpha=0)
    add_colour_legend(fig, [*((kind, COLORS[kind]) for kind in KINDS if kind in ev["kind"]),
                            *([(BUSY_LABEL, BUSY_COLOR)] if busy["y"] else [])])
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[
        ("op", "@name"), ("rank", "@rank"), ("lane", "@lane"), ("duration", "@dur"),
        ("kind", "@kind"), ("collective", "@key")]))
    fig.add_tools(TapTool(renderers=[bars]))
    src.selected.js_on_change("indices", CustomJS(args={"src": src}, code=TAP_JS))
    fig.yaxis.major_label_text_font_size = "8pt"
    fig.yaxis.group_text_font_size = "9pt"
    fig.yaxis.group_label_orientation = "horizontal"
    fig.ygrid.grid_line_color = None
    # the axis' words, the same phrase: timeline_source moves exactly the applied offsets
    moved = f"{alignment_words(a.clocks)} (table below)"
    note = (f"{len(ev['y']):,} bars: each lane's longest events and every collective; "
            f"{merged:,} shorter events are drawn as grey busy bars (darker = busier); {moved}.")
    return fig, note


def sections(profile: Profile, a: RunAnalysis, figures: list[Any]) -> list[Markup]:
    """The timeline and clock sections (nothing when there is nothing to show)."""
    out = []
    drawn = timeline_figure(profile, a)
    if drawn is not None:
        fig, note = drawn
        figures.append(fig)
        out.append(section("Timeline of every rank", html.join(
            [html.note(note), html.figure_slot(len(figures) - 1)]), "timeline"))
    if a.clocks:
        skew = run_skew(a.clocks)
        words = ("Offsets from the ends of the collectives each rank shares with rank "
                 f"{a.clocks[0].reference}; applied to arrivals and waits only when larger "
                 "than 5 µs and 3x the rank's residual, and never when every trace names "
                 "one host (one machine, one clock).")
        if skew.residual_max_us is not None:
            words += (f" Residual skew over the run: median "
                      f"{format_duration(skew.residual_median_us)}, "
                      f"max {format_duration(skew.residual_max_us)}.")
        out.append(section("Clocks across ranks", html.join(
            [html.note(words), tables.html_table(a.clocks, CLOCKS)]), "clocks"))
    return out
