"""The %%gpumem timeline's legend sits under the chart, not over the lines it
names (a new-user walk saw it cover the allocated and reserved lines)."""

from __future__ import annotations

import torch
from bokeh.models import Legend

import torchlens
from torchlens.render.memory.report import timeline_figure


def test_the_timeline_legend_is_below_the_plot() -> None:
    with torchlens.gpumem() as r:
        keep = [torch.randn(256, 1024) for _ in range(3)]
    fig = timeline_figure(r.analysis())
    assert not [m for m in fig.center if isinstance(m, Legend)]
    below = [m for m in fig.below if isinstance(m, Legend)]
    assert len(below) == 1 and {i.label.value for i in below[0].items} >= {"allocated"}
    del keep
