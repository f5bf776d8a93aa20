"""The terminal's memory column says one kind of figure from start to end.

A CPU run showed ``381.3 MiB rss`` while it ran and ``~74.0 KiB`` once its
profiled steps' summaries came: the modelled allocator figure of the
allocations made inside a profiled step (a small BERT: ``~9.0 KiB``, less than
its weights), not the rank's memory. The column keeps the measured RSS.
"""

from __future__ import annotations

from torchlens.analysis.ranks.verdict import run_view
from torchlens.model.records import StepRecord
from torchlens.render.ranks.terminal import lines

MiB = 1 << 20


def _rec(step: int) -> StepRecord:
    t0 = step * 0.1
    return StepRecord.from_dict({"step": step, "t0": t0, "t1": t0 + 0.03,
                                 "phases": {"data": 0.001, "forward": 0.01, "backward": 0.01,
                                            "optimizer": 0.001, "collective": 0.0},
                                 "profiled": step in (4, 9),
                                 "mem": {"rss": 381 * MiB + step * 1024, "source": "rss"}})


def _memory_cells(with_summaries: bool) -> list[str]:
    summaries = [[{"step": s, "t0": s * 0.1, "memory": {"allocated": 74 * 1024, "reserved": 2 * MiB,
                                         "source": "modelled"}} for s in (4, 9)]
                 if with_summaries else [] for _ in range(2)]
    info = [{"rank": r, "node": 0, "host": "h", "silent_s": 0.1, "bye": None,
             "heartbeat": {"steps_done": 12}, "steps_sent": 12, "shared_run_dir": True}
            for r in range(2)]
    view = run_view({"world_size": 2, "ranks": info,
                     "steps": [[_rec(i) for i in range(12)] for _ in range(2)],
                     "summaries": summaries, "dropped": 0, "lost_after_s": 10.0})
    text = lines(view)
    head = next(i for i, t in enumerate(text) if t.lstrip().startswith("rank node"))
    return [t[t.rindex("h ") + 2:].split()[-2:] for t in text[head + 1:head + 3]], text


def test_the_memory_column_is_rss_before_and_after_the_summaries_come() -> None:
    before, _ = _memory_cells(False)
    after, text = _memory_cells(True)
    assert before == after == [["MiB", "rss"]] * 2, (before, after)
    assert not any("KiB" in t and "rss" not in t for t in text if t.startswith("   ")), text
