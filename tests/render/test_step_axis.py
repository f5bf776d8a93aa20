"""The step chart's robust axis top (``render.step_axis``): one spike does not
flatten the other lines, also when every rank has one (an
FSDP2 report's axis ran to 145 ms for the two warm-up steps 0 while its other
58 steps were 10-50 ms)."""

from __future__ import annotations

import random

from torchlens.render.step_axis import robust_top


def _run(ranks: int, steps: int, warmup_ms: float) -> tuple[list[float], list[int]]:
    rng = random.Random(0)
    ys, groups = [], []
    for r in range(ranks):
        ys += [warmup_ms] + [rng.uniform(10, 50) for _ in range(steps - 1)]
        groups += [r] * steps
    return ys, groups


def test_a_warm_up_step_on_every_rank_is_above_the_axis() -> None:
    ys, groups = _run(2, 30, 145.0)
    top = robust_top(ys, groups)
    assert top is not None and 50 <= top < 145, top  # the 10-50 ms steps fill the chart
    assert robust_top(ys) is None  # all ranks pooled: the two warm-ups set the axis


def test_steps_without_a_spike_keep_an_axis_that_fits_them_all() -> None:
    ys, groups = _run(4, 30, 45.0)
    assert robust_top(ys, groups) is None


def test_a_rank_that_is_slow_throughout_is_not_cut() -> None:
    ys, groups = _run(2, 30, 45.0)
    ys = [y * 4 if g == 1 else y for y, g in zip(ys, groups, strict=True)]  # rank 1 is 4x
    assert robust_top(ys, groups) is None  # its steps are its own normal, on the axis
