"""The step breakdown as a stacked bar chart: one bar per ProfilerStep, one
colour per role, so a slow step and what made it slow show at a glance.

Draws ``analysis.trace.steps.step_breakdown`` as it is: the roles add up to the
step time, so each bar is as tall as its step. Roles are the step table's
columns (``tables.step_columns``), GPU roles only where the trace has GPU
activity.
"""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, HoverTool
from bokeh.plotting import figure

from torchlens.model.units import format_us_as_ms
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
    data: dict[str, Any] = {"step": labels,
                            "total": [format_us_as_ms(v) for v in steps["dur_us"]]}
    for c in cols:
        data[c.key] = (steps[c.key].to_numpy(dtype=float) / 1e3).tolist()
    fig = figure(
        title=f"{title}: time per role in each step (ms)", x_range=labels,
        height=300, sizing_mode="stretch_width", toolbar_location=None,
        tools="", y_axis_label="ms",
    )
    renderers = fig.vbar_stack(
        [c.key for c in cols], x="step", width=0.8, source=ColumnDataSource(data),
        color=[ROLE_COLORS[c.key] for c in cols],
        legend_label=[c.label for c in cols],
    )
    for r, c in zip(renderers, cols, strict=True):
        fig.add_tools(HoverTool(renderers=[r], tooltips=[
            ("step", "@step"), (c.label, f"@{{{c.key}}}{{0,0.0}} ms"), ("step time", "@total")]))
    fig.y_range.start = 0
    fig.xgrid.grid_line_color = None
    fig.xaxis.major_label_orientation = 0.8 if len(labels) > 12 else 0
    fig.legend.orientation = "horizontal"
    fig.legend.location = "top_left"
    fig.add_layout(fig.legend[0], "above")
    return fig
