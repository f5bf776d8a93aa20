"""One "median step" figure: the verdict's and the per-rank table's come from
the same steps (not 28.4 ms in the verdict and 32.3 ms in the rows below it)."""

from __future__ import annotations

from torchlens.analysis.ranks.verdict import run_view
from torchlens.model.records import StepRecord
from torchlens.model.units import format_ms
from torchlens.render.ranks.terminal import lines


def _rec(step: int, dur: float, label: str | None = None) -> StepRecord:
    t0 = step * 1.0
    d = {"step": step, "t0": t0, "t1": t0 + dur,
         "phases": {"data": 0.001, "forward": dur / 3, "backward": dur / 3,
                    "optimizer": 0.001, "collective": 0.0},
         "mem": {"rss": 100 << 20, "source": "rss"}}
    if label:
        d["label"] = label
    return StepRecord.from_dict(d)


def _run(rank: int) -> list[StepRecord]:
    # 25 slow warm-up steps, 20 steady ones, and an evaluation span in between
    recs = [_rec(i, 0.060 + rank * 0.0005) for i in range(25)]
    recs += [_rec(i, 0.030 + rank * 0.0005) for i in range(25, 45)]
    recs.insert(30, _rec(30, 0.900, label="evaluation"))
    return recs


def test_the_verdict_median_step_is_the_median_of_the_rows_below_it() -> None:
    steps = [_run(0), _run(1), _run(2)]
    info = [{"rank": r, "node": 0, "host": "h", "silent_s": 0.1, "bye": None,
             "heartbeat": {"steps_done": 45}, "steps_sent": 46, "shared_run_dir": True}
            for r in range(3)]
    view = run_view({"world_size": 3, "ranks": info, "steps": steps,
                     "summaries": [[], [], []], "dropped": 0, "lost_after_s": 10.0})
    mid = view.verdict.value("median_step_ms")
    assert f"median {format_ms(mid)}" in view.verdict.sentence
    rows = sorted(r.step_ms for r in view.ranks)
    assert format_ms(rows[1]) == format_ms(mid)  # the median rank's row says the same
    text = "\n".join(lines(view))
    # the table says which steps its times cover, in the verdict's words
    assert "last 20 steps" in text.split("verdict:", 1)[1].split("\n", 1)[1]


def test_the_report_calls_one_steps_median_over_ranks_by_another_name() -> None:
    """The report's "Step time across ranks" table has, per profiled step, the
    median of the ranks' times: not a rank's median step, so not that name."""
    from torchlens.render import tables
    from torchlens.render.runs.report import SKEW

    html = str(tables.html_table([{"step": 4, "ranks": 2, "median_us": 30_500.0,
                                   "max_us": 31_000.0, "longest_rank": 1,
                                   "skew_pct": 1.6}], SKEW))
    assert "median of the ranks" in html and "median step" not in html
