"""The run report's memory per rank over its steps (``analysis.runs.memory_steps``).

One line per rank of the figure the step records measured (CUDA allocated,
the C heap in use or RSS) over the step number, the steps the growth is
fitted over shaded, and a table beside it: each rank's first and last
figure and its growth per step over those steps. Drawn as it is given.
"""

from __future__ import annotations

from typing import Any

from bokeh.models import BoxAnnotation, ColumnDataSource, HoverTool
from bokeh.plotting import figure
from markupsafe import Markup

from torchlens.model.payloads import RankMemory, RunMemory
from torchlens.model.units import format_bytes
from torchlens.render import html, tables
from torchlens.render.columns import rank_color
from torchlens.render.page import section
from torchlens.render.tables import Column

MIB = float(1 << 20)
WINDOW_FILL = "#fdd49e"


def _columns(memory: RunMemory) -> list[Column]:
    window = memory.window
    fitted = f"steps {window[0]}-{window[1]}" if window else "the steps"
    return [Column("rank", "rank", str),
            Column("creeps", "memory creeps", lambda v: "yes" if v else "no", False),
            Column("first_step", "first step", str),
            Column("start_bytes", f"start ({memory.label})", format_bytes),
            Column("last_step", "last step fitted", str),
            Column("end_bytes", f"end ({memory.label})", format_bytes),
            Column("growth_per_step", f"growth per step ({fitted})",
                   lambda v: format_bytes(v, signed=True))]


def memory_figure(memory: RunMemory) -> Any:
    """Each rank's figure over its steps, the fitted steps shaded."""
    fig = figure(height=280, sizing_mode="stretch_width", tools="pan,wheel_zoom,reset,save",
                 x_axis_label="step", y_axis_label=f"{memory.label}, MiB",
                 title=f"Memory per rank over the steps ({memory.label})")
    for r in memory.ranks:
        src = ColumnDataSource({"step": r.step, "mib": [b / MIB for b in r.bytes],
                                "rank": [f"rank {r.rank}"] * len(r.step)})
        line = fig.line("step", "mib", source=src, color=rank_color(r.rank), line_width=2,
                        legend_label=f"rank {r.rank}")
        fig.add_tools(HoverTool(renderers=[line], tooltips=[("", "@rank"), ("step", "@step"),
                                                            (memory.label, "@mib{0.0} MiB")]))
    if memory.window:
        fig.add_layout(BoxAnnotation(left=memory.window[0], right=memory.window[1],
                                     fill_color=WINDOW_FILL, fill_alpha=0.35, level="underlay"))
    fig.legend.location = "top_left"
    fig.legend.click_policy = "hide"
    return fig


def sections(memory: RunMemory | None, figures: list[Any]) -> list[Markup]:
    """The memory section (nothing without memory in the step records)."""
    if memory is None or not memory.ranks:
        return []
    figures.append(memory_figure(memory))
    rows: list[RankMemory] = memory.ranks
    window = memory.window
    said = (f"{memory.label} at the end of each step, per rank, from the step records"
            + (f"; shaded: steps {window[0]}-{window[1]}, the steps the growth per step is "
               "fitted over (the memory-creep rule's: the last ones measured, the newest "
               "left out, since it is read as the job lets go of memory)" if window else "")
            + ".")
    return [section("Memory per rank over the steps", html.join(
        [html.note(said), html.figure_slot(len(figures) - 1),
         tables.html_table(rows, _columns(memory))]), "memory-steps")]
