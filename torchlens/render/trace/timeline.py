"""A zoomable Bokeh timeline of one trace: a lane per CPU thread and GPU stream.

Why it decimates, and why that is safe
--------------------------------------
A 100k-event trace drawn glyph by glyph makes a report of tens of megabytes and
a browser that stalls on every pan. At full zoom-out the plot is ``WIDTH_PX``
pixels wide, so an event shorter than one pixel (``span / WIDTH_PX``) cannot be
seen on its own anyway: a run of such events already paints as one solid bar.
We therefore draw, per lane and nesting row:

* every event at least one pixel wide, up to ``MAX_KEPT`` events over the whole
  plot (the longest first; the rest join the merged bars below);
* the other events as *busy bars*: events falling into neighbouring pixel
  columns are merged into one bar from the first start to the last end, whose
  hover says how many events it stands for and how much time they were busy.

At full zoom-out this draws the same pixels as the raw events. Zoomed in, a busy
bar stays a truthful "something ran here" with exact counts and busy time; the
individual names remain in the op and kernel tables. The title says how many
events were merged, so nothing is dropped silently. The number of glyphs is
bounded by ``MAX_KEPT + rows * WIDTH_PX / 2`` whatever the trace size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from bokeh.core.serialization import Serializer
from bokeh.models import (
    BasicTickFormatter,
    ColumnDataSource,
    FixedTicker,
    HoverTool,
    Quad,
    Range1d,
    WheelZoomTool,
)
from bokeh.plotting import figure

from torchlens.analysis.trace.events import open_before, sweep_order
from torchlens.model import Trace
from torchlens.model.units import format_durations, plural
from torchlens.render.glyphs import add_bare
from torchlens.render.legend import add_colour_legend, by_colour

WIDTH_PX = 1200  # plot width at full zoom-out; the decimation grid
MAX_KEPT = 8000  # individual events drawn over the whole plot
MAX_ROWS_PER_LANE = 6  # nesting rows per lane; deeper events fold into the last
ROW_PX = 16

#: Colours per normalized category (colour-blind-friendly Okabe-Ito hues).
CAT_COLORS = {
    "cpu_op": "#0072B2",
    "user_annotation": "#CC79A7",
    "gpu_user_annotation": "#CC79A7",
    "python_function": "#56B4E9",
    "cuda_runtime": "#E69F00",
    "cuda_driver": "#E69F00",
    "cuda_sync": "#D55E00",
    "kernel": "#009E73",
    "gpu_memcpy": "#F0E442",
    "gpu_memset": "#F0E442",
}
OTHER_COLOR = "#999999"
MERGED_COLOR = "#555555"
#: the legend's names for the two colours outside ``CAT_COLORS``
OTHER_LABEL = "other category"
MERGED_LABEL = "merged short events"
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
_SKIP_CATS = {"trace", "ac2g", "fwdbwd"}  # whole-trace span and flow arrows


@dataclass
class TimelineStats:
    """What the timeline drew, for the caption, tests and the size benchmark."""

    events: int = 0  # timed events in the trace
    drawn: int = 0  # events drawn as their own glyph
    merged_events: int = 0  # events folded into busy bars
    merged_bars: int = 0
    lanes: int = 0
    #: the trace's other events, which are no box on a lane: what they are -> how many
    not_drawn: dict[str, int] = field(default_factory=dict)

    @property
    def not_drawn_words(self) -> str:
        """Every event of the trace the timeline does not draw, said ("" when none)."""
        if not self.not_drawn:
            return ""
        parts = [f"{n:,} {what}" for what, n in
                 sorted(self.not_drawn.items(), key=lambda kv: -kv[1])]
        return "Not drawn: " + "; ".join(parts) + "."

    @property
    def glyphs(self) -> int:
        return self.drawn + self.merged_bars


def _lane_title(meta: dict[str, Any], key: tuple[str, int, int]) -> str:
    """A lane's label from the trace's own names (``meta`` keys are strings)."""
    kind, a, b = key
    if kind == "gpu":
        return f"GPU {a} stream {b}"
    thread = (meta.get("thread_names") or {}).get(f"{a}:{b}")
    if not thread:
        thread = f"thread {(meta.get('tid_labels') or {}).get(str(b), b)}"
    process = (meta.get("process_labels") or {}).get(str(a)) or f"pid {a}"
    return f"{thread.strip()} · {process}"


def _depths(lane: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Nesting depth of each event in its lane, capped at the last lane row.

    Inputs are sorted by (lane, ts, -dur). An event's depth is the number of
    earlier events of its lane still open when it starts (a stack sweep);
    that is one more than the depth of the innermost one (``open_before``),
    so depths follow from parent links by pointer jumping, three rounds
    being enough to tell every depth up to the cap.
    """
    parent = open_before(ts, end, lane, np.ones(len(ts), dtype=bool))
    depth = (parent >= 0).astype(np.int64)
    for _ in range(max(MAX_ROWS_PER_LANE - 1, 1).bit_length()):
        up = parent >= 0
        at = np.maximum(parent, 0)
        depth = depth + np.where(up, depth[at], 0)
        parent = np.where(up, parent[at], -1)
    return np.minimum(depth, MAX_ROWS_PER_LANE - 1)


def _busy_bars(ts: np.ndarray, end: np.ndarray, px: float) -> tuple[np.ndarray, ...]:
    """Merge events into bars over runs of occupied pixel columns.

    Returns (left, right, count, busy_us) per bar.
    """
    col = np.floor(ts / px).astype(np.int64)
    order = np.argsort(col, kind="stable")
    col, ts, end = col[order], ts[order], end[order]
    new_run = np.ones(len(col), dtype=bool)
    new_run[1:] = np.diff(col) > 1  # adjacent columns belong to the same run
    run = np.cumsum(new_run) - 1
    n = run[-1] + 1
    left = np.full(n, np.inf)
    right = np.full(n, -np.inf)
    np.minimum.at(left, run, ts)
    np.maximum.at(right, run, end)
    count = np.bincount(run, minlength=n)
    busy = np.bincount(run, weights=end - ts, minlength=n)
    return left, right, count, busy


def _codes(trace: Trace, column: str, labels: Any) -> list[int]:
    known = trace.events.categories.get(column, [])
    return [known.index(lab) for lab in labels if lab in known]


def _text(trace: Trace, column: str, rows: np.ndarray) -> np.ndarray:
    """A text column decoded for ``rows`` only ("" where missing)."""
    ev = trace.events
    if column not in ev.categories:
        return np.full(len(rows), "", dtype=object)
    labels = np.asarray(list(ev.categories[column]) + [""], dtype=object)
    codes = ev[column][rows]
    return labels[np.where(codes < 0, len(labels) - 1, codes)]


def _timed_events(trace: Trace) -> dict[str, np.ndarray]:
    """The ``X`` events the timeline can draw, as plain numpy arrays.

    Text columns stay codes here (``rows`` are the event rows); names are
    decoded only for the events that get their own glyph.
    """
    ev = trace.events
    if len(ev) == 0:
        return {}
    keep = np.isin(ev["ph"], _codes(trace, "ph", ["X"]))
    keep &= ~np.isin(ev["cat"], _codes(trace, "cat", _SKIP_CATS))
    rows = np.flatnonzero(keep)
    not_drawn = _not_drawn(trace, keep)
    out = {
        "rows": rows,
        "ts": ev["ts"][rows].astype(float),
        "dur": np.maximum(ev["dur"][rows].astype(float), 0.0),
        "pid": ev["pid"][rows],
        "tid": ev["tid"][rows],
        "device": ev["device"][rows] if "device" in ev else np.full(len(rows), -1),
        "stream": ev["stream"][rows] if "stream" in ev else np.full(len(rows), -1),
    }
    out["gpu"] = (out["device"] >= 0) | np.isin(ev["cat"][rows],
                                                 _codes(trace, "cat", _GPU_CATS))
    out["not_drawn"] = not_drawn  # type: ignore[assignment]
    return out


#: what an event the timeline draws no box for is, by its phase (``ph``)
PHASE_WORDS = {"s": "flow events (arrows from a CPU launch to its GPU kernel, and "
                    "autograd's links)", "f": "flow events (arrows from a CPU launch to its "
                    "GPU kernel, and autograd's links)", "t": "flow events (arrows from a CPU "
                    "launch to its GPU kernel, and autograd's links)",
               "i": "instant events (no duration)", "I": "instant events (no duration)",
               "C": "counter samples", "M": "metadata events (process and thread names)",
               "X": "spans of the whole trace or of a flow (categories trace, ac2g, fwdbwd)"}


def _not_drawn(trace: Trace, drawn: np.ndarray) -> dict[str, int]:
    """How many of the trace's events the timeline draws no box for, by what they are."""
    ev = trace.events
    phases = ev.categories["ph"]
    codes = ev["ph"][~drawn]
    counts = np.bincount(codes[codes >= 0], minlength=len(phases))
    out: dict[str, int] = {}
    if (codes < 0).any():
        out["events without a phase"] = int((codes < 0).sum())
    for code, n in enumerate(counts.tolist()):
        if n:
            words = PHASE_WORDS.get(phases[code], f"events of phase {phases[code]!r}")
            out[words] = out.get(words, 0) + n
    return out


def _lanes(e: dict[str, np.ndarray]) -> tuple[np.ndarray, list[tuple[str, int, int]]]:
    """Lane number of each event and each lane's key, CPU threads first."""
    gpu = e["gpu"]
    a = np.where(gpu, np.where(e["device"] >= 0, e["device"], e["pid"]), e["pid"])
    b = np.where(gpu, np.where(e["stream"] >= 0, e["stream"], e["tid"]), e["tid"])
    # one int per (gpu, a, b) in the same order as the triples (CPU first)
    a_values, a_pos = np.unique(a, return_inverse=True)
    b_values, b_pos = np.unique(b, return_inverse=True)
    key = (gpu.astype(np.int64) * len(a_values) + a_pos) * len(b_values) + b_pos
    uniq, inverse = np.unique(key, return_inverse=True)
    g, rest = np.divmod(uniq, len(a_values) * len(b_values))
    x, y = np.divmod(rest, len(b_values))
    return inverse.ravel(), [("gpu" if gi else "cpu", int(a_values[xi]), int(b_values[yi]))
                             for gi, xi, yi in zip(g, x, y, strict=True)]


def _layout_rows(
    trace: Trace, e: dict[str, np.ndarray], start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[float], dict[float, str], int]:
    """Give each event a y row: lanes stacked, nesting depth within a lane.

    Returns (event index, row) arrays, lane tick positions and labels, rows used.
    """
    lane, keys = _lanes(e)
    order = sweep_order(start, e["dur"], lane)  # by lane, start, longest first
    lane_of = lane[order]
    depth = _depths(lane_of, start[order], end[order])
    lane_rows = np.zeros(len(keys), np.int64)
    np.maximum.at(lane_rows, lane_of, depth + 1)
    first_row = np.zeros(len(keys), np.int64)
    ticks, labels, row = [], {}, 0
    for i, key in enumerate(keys):
        n_rows = int(lane_rows[i])
        first_row[i] = row
        center = row + (n_rows - 1) / 2 + 0.5
        ticks.append(center)
        labels[center] = _lane_title(trace.meta, key)
        row += n_rows + 1  # one empty row between lanes
    return order, first_row[lane_of] + depth, ticks, labels, row


def build_timeline(trace: Trace, title: str = "Timeline") -> tuple[Any, TimelineStats]:
    """The timeline figure for ``trace`` (None if it has no timed events) and
    what it drew; see the module docstring for the decimation."""
    e = _timed_events(trace)
    stats = TimelineStats(events=len(e.get("ts", ())), not_drawn=e.get("not_drawn") or {})
    if not stats.events:
        return None, stats
    t_min = float(e["ts"].min())
    start = e["ts"] - t_min
    end = start + e["dur"]
    span = max(float(end.max()), 1.0)
    px = span / WIDTH_PX
    all_idx, all_row, ticks, labels, n_rows = _layout_rows(trace, e, start, end)
    stats.lanes = len(ticks)

    # The longest events get their own glyph (all those wider than a pixel come
    # first); the shortest, invisible one by one at full zoom-out, are merged.
    keep = np.zeros(len(all_idx), dtype=bool)
    keep[np.argsort(-e["dur"][all_idx], kind="stable")[:MAX_KEPT]] = True

    # Busy bars first, so that the individual events are drawn over them.
    cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
    rest_idx, rest_row = all_idx[~keep], all_row[~keep]
    for r in np.unique(rest_row):
        sel = rest_idx[rest_row == r]
        left, right, count, busy = _busy_bars(start[sel], end[sel], px)
        n = len(left)
        stats.merged_bars += n
        stats.merged_events += int(count.sum())
        _extend(cols, left, np.maximum(right, left + px), np.full(n, r),
                [f"{c:,} events merged" for c in count], ["merged"] * n,
                [f"{d} busy" for d in format_durations(busy)], [""] * n, [MERGED_COLOR] * n)
    kept = all_idx[keep]
    stats.drawn = len(kept)
    rows = e["rows"][kept]
    cat = _text(trace, "cat", rows)
    _extend(cols, start[kept], end[kept], all_row[keep], _text(trace, "name", rows),
            cat, format_durations(e["dur"][kept]), _text(trace, "input_dims", rows),
            [CAT_COLORS.get(c, OTHER_COLOR) for c in cat])
    return _figure(cols, ticks, labels, n_rows, span, stats, title), stats


class _Texts(list):
    """A text column of the glyph source, sent to BokehJS as the plain list it is.

    Bokeh would encode a list item by item (tens of thousands of Python calls
    for a large trace; numbers go as binary buffers already); every item here
    is a ``str``, which needs no encoding, so the JSON is the same.
    """


def _encode_texts(obj: _Texts, serializer: Any) -> list[str]:
    return list(obj)


try:
    Serializer.register(_Texts, _encode_texts)
except AssertionError:  # already registered (module reloaded)
    pass


_COLUMNS = ("left", "right", "bottom", "top", "name", "cat", "dur", "shapes", "color")
_NUMERIC = _COLUMNS[:4]


def _extend(cols: dict[str, list[Any]], left: np.ndarray, right: np.ndarray,
            row: np.ndarray, *text: Any) -> None:
    """Append glyphs: x in ms since trace start, a row's bar filling 80 %."""
    cols["left"].append(left / 1e3)
    cols["right"].append(right / 1e3)
    cols["bottom"].append(row + 0.1)
    cols["top"].append(row + 0.9)
    for name, values in zip(_COLUMNS[4:], text, strict=True):
        cols[name].append(np.asarray(values, dtype=object))


def _figure(
    cols: dict[str, list[Any]],
    ticks: list[float],
    labels: dict[float, str],
    n_rows: int,
    span_us: float,
    stats: TimelineStats,
    title: str,
) -> Any:
    source = ColumnDataSource({
        k: np.concatenate(v).astype(float) if k in _NUMERIC else _Texts(np.concatenate(v))
        for k, v in cols.items()
    })
    caption = f"{title}: {plural(stats.events, 'event')} in {plural(stats.lanes, 'lane')}"
    if stats.merged_events:
        caption += (
            f"; {stats.merged_events:,} short events merged into "
            f"{stats.merged_bars:,} grey busy bars (zoom in, hover for counts)"
        )
    fig = figure(
        title=caption,
        width=WIDTH_PX,
        height=max(160, 60 + ROW_PX * n_rows),
        x_range=Range1d(0, span_us / 1e3, bounds=(0, span_us / 1e3)),
        y_range=Range1d(n_rows, -0.5),
        x_axis_label="time since trace start (ms)",
        tools="xpan,xwheel_zoom,xbox_zoom,reset,save",
        toolbar_location="above",
        sizing_mode="stretch_width",
        output_backend="canvas",
    )
    # plain milliseconds at any span (Bokeh writes 1.200e+5 from 100,000 on)
    fig.xaxis.formatter = BasicTickFormatter(use_scientific=False)
    # no selecting tool, no muting legend: a renderer without the glyph copies
    bars = add_bare(fig, Quad(left="left", right="right", bottom="bottom", top="top",
                              fill_color="color", line_color=None), source)
    fig.add_tools(
        HoverTool(
            tooltips=[("name", "@name"), ("category", "@cat"), ("duration", "@dur"),
                      ("input shapes", "@shapes")],
        )
    )
    fig.toolbar.active_scroll = next(t for t in fig.tools if isinstance(t, WheelZoomTool))
    # each colour drawn, named with the categories the hover shows; its swatch
    # is the first bar drawn in it (the chart is finished: no bars arrive later)
    colours, first = np.unique(np.asarray(source.data["color"], dtype=str), return_index=True)
    rows = dict(zip(colours.tolist(), first.tolist(), strict=True))
    entries = [*by_colour(CAT_COLORS), (OTHER_LABEL, OTHER_COLOR), (MERGED_LABEL, MERGED_COLOR)]
    add_colour_legend(fig, [(label, c) for label, c in entries if c in rows], drawn=(bars, rows))
    fig.yaxis.ticker = FixedTicker(ticks=ticks)
    fig.yaxis.major_label_overrides = labels
    # no y grid lines: lanes are rows, not values (a grid drawing nothing still costs
    # every shown report a model)
    fig.center = [r for r in fig.center if r not in fig.ygrid]
    return fig
