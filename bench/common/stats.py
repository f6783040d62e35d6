"""Intervals for benchmark figures measured over several seeds (issue 26).

Each seed of a benchmark draws its own random split, so the spread of a figure over the seeds
includes split sampling; the Student-t interval over the per-seed values says how far the mean
may sit from the figure's expectation. scipy is not a dependency of the project, so the t
quantile is computed here, exactly, from the closed form of the t distribution for integer
degrees of freedom (Abramowitz & Stegun 26.7.3–26.7.4) inverted by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

CONFIDENCE = 0.95
_BISECTION_STEPS = 200  # halvings of [0, upper]: far below float resolution well before this


def t_central_probability(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's T with ``df`` (integer ≥ 1) degrees of freedom.

    With θ = atan(t/√df): for odd df, (2/π)(θ + sinθ cosθ Σ_{j=0}^{(df−3)/2} a_j cos^{2j}θ) with
    a_0 = 1, a_j = a_{j−1}·2j/(2j+1) (the sum empty for df = 1); for even df,
    sinθ Σ_{j=0}^{(df−2)/2} b_j cos^{2j}θ with b_0 = 1, b_j = b_{j−1}·(2j−1)/(2j).
    """
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a positive integer, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    total, term = 0.0, 1.0
    if df % 2:
        for j in range((df - 1) // 2):
            total += term
            term *= cos2 * (2 * j + 2) / (2 * j + 3)
        return 2 / math.pi * (theta + sin * math.cos(theta) * total)
    for j in range(df // 2):
        total += term
        term *= cos2 * (2 * j + 1) / (2 * j + 2)
    return sin * total


def t_quantile(confidence: float, df: int) -> float:
    """The t with P(|T| ≤ t) = ``confidence`` (two-sided), e.g. 2.776 for 95 % and df = 4."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    low, high = 0.0, 1.0
    while t_central_probability(high, df) < confidence:
        high *= 2
    for _ in range(_BISECTION_STEPS):
        mid = (low + high) / 2
        if t_central_probability(mid, df) < confidence:
            low = mid
        else:
            high = mid
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2


def t_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float, float]:
    """(mean, low, high): mean ± t_{(1+c)/2, n−1} · sd/√n over ``values`` (sd with n − 1).

    One value has no interval: low and high are NaN, so no threshold is ever cleared by it.
    """
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile(confidence, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half
