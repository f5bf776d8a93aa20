"""No legend of the per-rank charts sits inside its plot.

The RSS chart of ``%ddp_check``'s report and of ``torchlens.watch`` had its
rank legend in the top-left corner, over the lines it names (a rank's RSS
climbs there first). Every legend goes above or below the plot, as the step
chart's and the timelines' do.
"""

from __future__ import annotations

from typing import Any

from bokeh.models import Legend, Plot

from torchlens.frontends.shared.live_view import ProfiledLiveView
from torchlens.model.messages import DdpHeartbeat
from torchlens.render.ddp.heartbeats import LivePlot, rank_figures


def _inside(layout: Any) -> list[str]:
    return [plot.title.text for plot in layout.select({"type": Plot})
            if any(isinstance(c, Legend) for c in plot.center)]


def test_no_rank_chart_has_its_legend_over_its_lines() -> None:
    beats = [DdpHeartbeat(t_rel=0.5 * i, rank=r, phase="step", rss=(300 + i) * 2**20,
                          collectives=i) for i in range(10) for r in (0, 1, 2)]
    for layout in (rank_figures(beats, 3), LivePlot(3).layout,
                   ProfiledLiveView(3, 5, modelled=True).layout):
        assert _inside(layout) == []
