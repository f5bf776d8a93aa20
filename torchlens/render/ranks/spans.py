"""Labelled spans on the live step chart (``%ddp_check --profile``, ``torchlens.watch``).

A span a framework labelled (``StepRecord.label``: the Hugging Face Trainer's
``evaluation`` and ``checkpoint``) is no training step. On the rank's step
line an evaluation of seconds read as a spike of the training; so it is a
marker of its own, at the step it followed, with a legend entry that shows
once the first one came (a run without them is not told about them).
"""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, HoverTool, LegendItem

from torchlens.model.records import StepRecord
from torchlens.render.ranks.lanes import Cell

LEGEND = "evaluation or checkpoint (not a step)"
SPAN_FILL = "#6a3d9a"


def training(records: list[StepRecord]) -> list[StepRecord]:
    """The records that are training steps (no ``label``)."""
    return [rec for rec in records if not rec.labelled]


def span_points(color: str, records: list[StepRecord]) -> list[dict[str, Cell]]:
    """The labelled spans of one rank's ``records`` as marker rows."""
    return [{"step": rec.step, "step_ms": (rec.t1 - rec.t0) * 1e3, "label": rec.label,
             "color": color} for rec in records if rec.labelled]


def span_marks(fig: Any) -> tuple[ColumnDataSource, LegendItem]:
    """The markers' source and their legend entry (hidden until ``show``)."""
    src = ColumnDataSource({"step": [], "step_ms": [], "label": [], "color": []})
    marks = fig.scatter("step", "step_ms", source=src, marker="diamond", size=10,
                        fill_color=SPAN_FILL, line_color="color", line_width=1.5)
    fig.add_tools(HoverTool(renderers=[marks], tooltips=[
        ("", "@label (not a training step)"), ("after step", "@step"),
        ("took", "@step_ms{0,0.0} ms")]))
    item = LegendItem(label=LEGEND, renderers=[marks], visible=False)
    fig.legend[0].items.append(item)
    return src, item
