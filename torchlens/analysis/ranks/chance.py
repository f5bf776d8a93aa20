"""How likely a count is by chance: the tests behind "a rank arrives last
more often than chance" (the step records' ``analysis.ranks.slow`` and the
profiled window's ``analysis.runs.slow_ranks``), and the robust spread a
wait is held against."""

from __future__ import annotations

import math
from statistics import median

#: 1.4826 x MAD estimates a normal spread's standard deviation
MAD_SCALE = 1.4826


def binomial_tail(k: int, m: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(m, p)."""
    if k <= 0:
        return 1.0
    if k > m or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    # the terms from k up, in logs; past the mode they only shrink, so the sum
    # stops once a term no longer changes it
    lp, lq = math.log(p), math.log1p(-p)
    log_term = math.lgamma(m + 1) - math.lgamma(k + 1) - math.lgamma(m - k + 1) + k * lp + (
        m - k) * lq
    total = 0.0
    for i in range(k, m + 1):
        term = math.exp(log_term)
        total += term
        if i > m * p and term <= total * 1e-15:
            break
        if i < m:
            log_term += math.log(m - i) - math.log(i + 1) + lp - lq
    return min(total, 1.0)


def robust_spread(values: list[float]) -> float:
    """``MAD_SCALE`` x the median absolute deviation: a spread one outlier
    cannot move (a standard deviation on normal data)."""
    mid = median(values)
    return MAD_SCALE * median(abs(v - mid) for v in values)
