"""The live view's step chart when ranks stop at one step (a failure takes its
peers with it): each ✖ keeps its own point, and the labels "rank 0", "rank 1"
are one line apart at one height, never drawn over each other."""

from __future__ import annotations

import msgspec
from bokeh.models import LabelSet

from ranks.rank_fixtures import T_START, make_run
from torchlens.render.ranks.view import RankProfileView

#: the labels' 9pt text is 12 px high
TEXT_PX = 12


def test_ranks_that_stop_at_one_step_have_labels_a_line_apart() -> None:
    steps, sums = make_run(world=2, steps=20, straggler=1)
    last = steps[0][-1]  # rank 0's last step 2 ms shorter: its ✖ sits a little lower
    steps[0][-1] = msgspec.structs.replace(last, t1=last.t1 - 0.002)
    view = RankProfileView(2, every=5, modelled=True, t0=T_START)
    for r in range(2):
        view.push_steps(r, steps[r])
    view.flush(force=True)
    t_end = max(steps[r][-1].t1 for r in range(2)) + 0.01
    view.rank_ended(1, "RuntimeError: boom", t_end)
    view.rank_ended(0, "failed: a peer went away", t_end)
    view.flush(force=True)
    ended = view.panels.ended.data
    assert ended["label"] == ["rank 1", "rank 0"] and ended["step"][0] == ended["step"][1]
    assert ended["step_ms"][0] != ended["step_ms"][1]  # each ✖ at its own point
    (labels,) = [x for x in view.panels.step_fig.center
                 if isinstance(x, LabelSet) and x.source is view.panels.ended]
    ys = ended[labels.y]
    assert ys[0] == ys[1]  # one height: the offsets alone set them apart
    dy = ended[labels.y_offset]
    assert abs(dy[0] - dy[1]) >= TEXT_PX + 2, dy
    # a third rank at another step is not pushed down
    view.rank_ended(1, "again", steps[1][3].t1 + 1e-4)
    view.flush(force=True)
    assert view.panels.ended.data["dy"][-1] == dy[0]
