"""The step breakdown as a stacked bar chart: one bar per ProfilerStep, one
colour per role, so a slow step and what made it slow show at a glance.

Draws ``analysis.trace.steps.step_breakdown`` as it is: the roles add up to the
step time, so each bar is as tall as its step. Roles are the step table's
columns (``tables.step_columns``), GPU roles only where the trace has GPU
activity.

All bars are one renderer over one source, a row per (role, step) with its
stacked bottom and top, rather than Bokeh's ``vbar_stack`` (a renderer, two
stack transforms and a hover tool per role): the same bars, legend and hover
in a third of the Bokeh models, and each model costs every shown report a
serializing walk, paid by every notebook cell that shows one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem, VBar
from bokeh.plotting import figure

from torchlens.model.units import format_us_as_ms
from torchlens.render.glyphs import add_bare
from torchlens.render.tables import step_columns

#: One colour per role, the kernel and CPU roles the strongest.
ROLE_COLORS = {
    "kernel_us": "#1f77b4", "memcpy_us": "#ff7f0e", "memset_us": "#bcbd22",
    "comm_us": "#9467bd", "runtime_us": "#d62728", "dataloader_us": "#8c564b",
    "cpu_exec_us": "#2ca02c", "other_us": "#c7c7c7",
}


def build_step_chart(steps: Any, has_gpu: bool, title: str = "Step breakdown") -> Any:
    """A Bokeh figure of the steps' time per role in ms (None without steps)."""
    if steps is None or len(steps) == 0:
        return None
    cols = [c for c in step_columns(has_gpu)
            if c.key in ROLE_COLORS and c.key in steps.columns]
    labels = [f"step {int(s)}" for s in steps["step"]]
    totals = [format_us_as_ms(v) for v in steps["dur_us"]]
    ms = np.array([steps[c.key].to_numpy(dtype=float) / 1e3 for c in cols])  # role x step
    tops = np.cumsum(ms, axis=0)  # stacked in column order, the first role at the bottom
    n = len(labels)
    source = ColumnDataSource({
        "step": labels * len(cols), "total": totals * len(cols),
        "role": [c.label for c in cols for _ in range(n)],
        "color": [ROLE_COLORS[c.key] for c in cols for _ in range(n)],
        "ms": ms.ravel().tolist(), "bottom": (tops - ms).ravel().tolist(),
        "top": tops.ravel().tolist(),
    })
    fig = figure(
        title=f"{title}: time per role in each step (ms)", x_range=labels,
        height=300, sizing_mode="stretch_width", toolbar_location=None,
        tools="", y_axis_label="ms",
    )
    # nothing selects, the legend does not mute: a renderer without the glyph copies
    bars = add_bare(fig, VBar(x="step", bottom="bottom", top="top", width=0.8,
                              fill_color="color", line_color="color"), source)
    fig.add_tools(HoverTool(renderers=[bars], tooltips=[
        ("step", "@step"), ("role", "@role"), ("time", "@ms{0,0.0} ms"),
        ("step time", "@total")]))
    fig.y_range.start = 0
    fig.center = [r for r in fig.center if r not in fig.xgrid]  # no lines between steps
    fig.xaxis.major_label_orientation = 0.8 if len(labels) > 12 else 0
    # one entry per role, its swatch drawn from the role's first bar
    fig.add_layout(Legend(items=[LegendItem(label=c.label, renderers=[bars], index=i * n)
                                 for i, c in enumerate(cols)],
                          orientation="horizontal", location="top_left"), "above")
    return fig
