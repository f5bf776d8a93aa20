"""The words of the slow-rank finding match the job: a stall between two steps
is named by the loop index of the step it delays (``for step in range(n)``
counts as the step records do, from 0), its median step names its window, and
the NCCL caveat on host timers is only said where a rank could run NCCL."""

from __future__ import annotations

from torchlens.analysis.ranks.slow import slow_rank
from torchlens.model.records import StepMemory, StepRecord

T0 = 1795804276.0


def _run(source: str | None = None, part: str = "other") -> list[list[StepRecord]]:
    """Two ranks of 100 steps. Rank 1 sleeps 150 ms at the top of loop
    iterations 9, 19, ..., 99 (``step % 10 == 9``, as benchmarks/zoo/_zoo.py
    does): after optimizer step ``i - 1``, before step ``i``'s first phase,
    which is where the step source cuts step ``i - 1`` (``autostep``), so the
    sleep lands in record ``i - 1``'s time outside every phase; rank 0 waits
    for it in step ``i``'s backward. ``source``: each record's memory source."""
    mem = StepMemory(rss=1 << 28, source=source) if source else None
    out = []
    for r in range(2):
        t, recs = T0, []
        for s in range(100):
            ph = {"data": 0.1, "forward": 0.5, "backward": 2.0 + (s * 7 + r * 3) % 5 * 0.1,
                  "optimizer": 0.6, "collective": 0.0}
            other = 0.3
            if r == 1 and s % 10 == 8:  # the sleep of loop iteration s + 1
                if part == "other":
                    other += 150.0
                else:
                    ph[part] += 150.0
            if r == 0 and s % 10 == 9:
                ph["backward"] += 150.0
            ms = sum(ph.values()) + other
            recs.append(StepRecord(step=s, t0=t, t1=t + ms / 1e3,
                                   phases={k: v / 1e3 for k, v in ph.items()}, mem=mem))
            t += ms / 1e3
        out.append(recs)
    return out


def test_a_stall_between_steps_is_named_by_its_records_and_says_where_it_may_be() -> None:
    # the records run from a step's first phase to the next's: a pause after the
    # batch of iteration 48 and one at the top of iteration 49 both land in record
    # 48; the words name the record and say so, and never a step past the last
    f = slow_rank(_run()).finding
    assert f.value("cause") == "stall" and f.value("rank") == 1
    assert "in steps 48, 58, 68, 78, 88, 98 (counted from 0; a pause at the top of the loop" \
        in f.sentence, f.sentence
    assert "100" not in f.sentence.split("(")[2]  # the last record is 99


def test_a_stall_inside_a_phase_is_named_by_the_step_it_ran_in() -> None:
    f = slow_rank(_run(part="data")).finding
    assert f.value("rank") == 1
    assert "in steps 48, 58, 68, 78, 88, 98 (counted from 0);" in f.sentence


def test_the_stall_median_step_names_its_window() -> None:
    f = slow_rank(_run()).finding
    assert f.value("steps_compared") == 60
    assert "over those 60 steps, whose median is" in f.sentence


def test_a_cpu_job_says_host_timers_without_the_nccl_caveat() -> None:
    f = slow_rank(_run(source="rss")).finding
    assert f.sentence.endswith("; phase times: host timers")
    assert "NCCL" not in str(f)


def test_a_gpu_rank_on_host_timers_keeps_the_nccl_caveat() -> None:
    f = slow_rank(_run(source="cuda")).finding
    assert "phase times: host timers (with NCCL the wait shows" in f.sentence


def test_the_straggler_table_gives_a_stalling_rank_the_verdicts_cause() -> None:
    from torchlens.analysis.runs.causes import with_verdict
    from torchlens.analysis.runs.rows import StragglerRow

    f = slow_rank(_run()).finding
    rows = with_verdict([StragglerRow(rank=0), StragglerRow(rank=1)], f)
    named = rows[1]
    assert named.cause == "stall" and "6 stalls of" in named.cause_words, named
    assert rows[0].cause is None  # no second cause beside the verdict's
