"""A rank with a single heartbeat in a short run (``%ddp_check --strict`` stops a
mismatched 0.2 s step: rank 0 sent one) is drawn in the memory and collectives
charts: a point, where a line needs two."""

from __future__ import annotations

from torchlens.model.messages import DdpHeartbeat
from torchlens.render.ddp.heartbeats import rank_figures


def _hb(rank: int, t: float) -> DdpHeartbeat:
    hb = DdpHeartbeat(t=100.0 + t, phase="step 0", rss=(230 + rank) << 20, collectives=1)
    hb.rank, hb.t_rel = rank, t
    return hb


def test_a_rank_with_one_heartbeat_has_a_visible_mark_in_each_chart() -> None:
    beats = [_hb(0, 2.55), *(_hb(1, 2.35 + 0.05 * i) for i in range(5))]
    layout = rank_figures(beats, world_size=2)
    figs = [f for f in layout.children if getattr(f, "title", None) is not None] \
        if hasattr(layout, "children") else list(layout)
    charts = {f.title.text.split(" (")[0]: f for f in figs if f.title.text}
    for title in ("RSS per rank", "Collectives issued per rank"):
        fig = charts[title]
        marks = [r for r in fig.renderers if type(r.glyph).__name__ == "Scatter"
                 and len(r.data_source.data.get("t", [])) == 1]
        assert marks, (title, [type(r.glyph).__name__ for r in fig.renderers])
