"""A straggler on a loaded machine: the others' own waits swing by more than
the straggler's wait from step to step, but it arrives last in nearly every
step. Arrival order that is beyond doubt names it; an order that chance
could give does not."""

from __future__ import annotations

from torchlens.analysis.ranks.slow import slow_rank
from torchlens.model.records import StepRecord

T0 = 1795804276.0


def _run(late_steps: int, steps: int = 40, extra_ms: float = 7.0) -> list[list[StepRecord]]:
    """Rank 1's forward is ``extra_ms`` longer in the last ``late_steps`` of each
    20; in the other steps rank 0's is. Both ranks' backward swings by up to
    60 ms a step (the machine's load), which the other rank waits inside."""
    out = []
    for r in range(2):
        t, recs = T0, []
        for s in range(steps):
            slow = 1 if s % 20 < late_steps else 0
            swing = ((s * 37) % 13) * 5.0  # 0-60 ms, the same on both ranks
            forward = 2.0 + (extra_ms if r == slow else 0.0)
            backward = 3.0 + swing + (extra_ms if r != slow else 0.0)
            ms = 0.2 + forward + backward + 0.5
            recs.append(StepRecord(step=s, t0=t, t1=t + ms / 1e3,
                                   phases={"data": 0.2e-3, "forward": forward / 1e3,
                                           "backward": backward / 1e3, "optimizer": 0.5e-3,
                                           "collective": 0.0, "save": 0.0, "eval": 0.0}))
            t += ms / 1e3
        out.append(recs)
    return out


def test_last_in_19_of_20_steps_is_the_slow_rank_whatever_the_swing() -> None:
    v = slow_rank(_run(late_steps=19))
    assert v.rank == 1, v.finding
    assert "last in 19 of the last 20 steps" in v.finding.sentence
    assert "forward" in v.finding.sentence


def test_last_in_15_of_20_with_a_wait_inside_the_swing_is_not_named() -> None:
    v = slow_rank(_run(late_steps=15))
    assert v.rank is None, v.finding
    assert "not significant" in v.finding.sentence


def test_a_straggler_not_significant_in_20_steps_is_named_over_the_last_60() -> None:
    """Last in 15 of every 20 steps: chance could give that in one window of 20
    (the test above), not in 45 of 60: the second look names it and says the
    window it judged."""
    v = slow_rank(_run(late_steps=15, steps=120))
    assert v.rank == 1, v.finding
    assert "last in 45 of the last 60 steps" in v.finding.sentence
    assert v.cause == "compute"


def test_the_second_look_needs_the_order_beyond_doubt() -> None:
    """Last in 11 of every 20 steps, 33 of the last 60: no rank."""
    v = slow_rank(_run(late_steps=11, steps=100))
    assert v.rank is None, v.finding
