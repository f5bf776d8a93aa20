"""Timeline: lanes, hover data, and bounded glyphs on the largest shared trace."""

from __future__ import annotations

import numpy as np
from bokeh.models import ColumnDataSource
from render_fixtures import HOSTILE, hostile_trace, make_trace

from torchlens.formats.kineto import load_trace
from torchlens.render.trace import timeline

LARGEST = "v100_ddp_sgd_annotations_rank0.json.gz"


def _source(fig) -> ColumnDataSource:
    return fig.renderers[0].data_source


def test_lanes_per_thread_and_stream() -> None:
    fig, stats = timeline.build_timeline(hostile_trace())
    assert stats.lanes == 2 and stats.events == 5
    labels = list(fig.yaxis.major_label_overrides.values())
    assert labels == ["thread 1 (main) · CPU", "GPU 0 stream 7"]
    data = _source(fig).data
    assert HOSTILE in data["name"]  # bokeh escapes tooltip fields itself
    assert any(s.startswith("[[2,3]]") for s in data["shapes"])


def test_no_timed_events_gives_no_figure() -> None:
    fig, stats = timeline.build_timeline(make_trace([{"name": "x", "ph": "i", "cat": "cpu_instant_event"}]))
    assert fig is None and stats.events == 0


def test_short_events_merge_into_busy_bars() -> None:
    # one long event and 10,000 tiny ones: tiny ones become a few busy bars
    rows = [{"name": "long", "cat": "cpu_op", "ts": 0.0, "dur": 1e6, "pid": 1, "tid": 2}]
    rows += [{"name": f"tiny{i}", "cat": "kernel", "ts": 10.0 + 50 * i, "dur": 1.0,
              "pid": 0, "tid": 7, "device": 0, "stream": 7} for i in range(10_000)]
    old = timeline.MAX_KEPT
    timeline.MAX_KEPT = 100
    try:
        fig, stats = timeline.build_timeline(make_trace(rows))
    finally:
        timeline.MAX_KEPT = old
    assert stats.drawn == 100 and stats.merged_events == 10_001 - 100
    assert stats.glyphs <= 100 + timeline.WIDTH_PX
    assert "merged into" in fig.title.text
    data = _source(fig).data
    merged = [i for i, c in enumerate(data["cat"]) if c == "merged"]
    counts = sum(int(data["name"][i].split()[0].replace(",", "")) for i in merged)
    assert counts == stats.merged_events  # every merged event is accounted for


def test_largest_shared_trace_is_bounded(traces_dir) -> None:
    trace = load_trace(traces_dir / LARGEST)
    fig, stats = timeline.build_timeline(trace)
    assert stats.events > 40_000
    assert stats.drawn + stats.merged_events == stats.events
    assert stats.glyphs <= timeline.MAX_KEPT + 20 * timeline.WIDTH_PX
    assert len(_source(fig).data["left"]) == stats.glyphs
    assert np.all(np.asarray(_source(fig).data["right"]) >= np.asarray(_source(fig).data["left"]))


def test_nested_events_get_their_own_rows() -> None:
    rows = [{"name": "step", "cat": "user_annotation", "ts": 100.0, "dur": 100.0, "pid": 1, "tid": 1},
            {"name": "op", "cat": "cpu_op", "ts": 110.0, "dur": 50.0, "pid": 1, "tid": 1},
            {"name": "inner", "cat": "cpu_op", "ts": 120.0, "dur": 10.0, "pid": 1, "tid": 1},
            {"name": "after", "cat": "cpu_op", "ts": 170.0, "dur": 10.0, "pid": 1, "tid": 1}]
    fig, _ = timeline.build_timeline(make_trace(rows))
    data = _source(fig).data
    row = {n: b for n, b in zip(data["name"], data["bottom"], strict=True)}
    assert row["step"] < row["op"] < row["inner"] and row["after"] == row["op"]


def test_a_long_trace_keeps_plain_millisecond_ticks() -> None:
    """A two-minute trace: its axis reads 120,000 ms, not 1.200e+5."""
    events = [{"name": "step", "ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1,
               "ts": t * 1e6, "dur": 5e5} for t in range(0, 120, 10)]
    fig, _ = timeline.build_timeline(make_trace(events))
    assert fig.x_range.end >= 1e5
    assert fig.xaxis[0].formatter.use_scientific is False


def test_every_event_is_drawn_merged_or_said_not_drawn(traces_dir) -> None:
    """The report accounts for each event of the trace: a box, a busy bar, or a
    line under the timeline that says what the rest are."""
    from html import unescape

    from torchlens.frontends.kinds import report_html
    from torchlens.model import Profile

    trace = load_trace(traces_dir / LARGEST)
    _, stats = timeline.build_timeline(trace)
    assert stats.drawn + stats.merged_events == stats.events
    assert stats.events + sum(stats.not_drawn.values()) == len(trace.events)
    flows = next(n for what, n in stats.not_drawn.items() if what.startswith("flow events"))
    ph = trace.events.text("ph")
    assert flows == int(np.isin(ph, ["s", "f", "t"]).sum()) > 0
    page = unescape(report_html(Profile(kind="trace", title=LARGEST, created_at=0.0,
                                        traces={"main": trace})))
    assert f"Not drawn: {flows:,} flow events (arrows from a CPU launch" in page
