"""Intervals for benchmark figures measured over several seeds (issue 26).

Each seed of a benchmark draws its own random split, so the spread of a figure over the seeds
includes split sampling; the Student-t interval over the per-seed values says how far the mean
may sit from the figure's expectation. A target counts as met only when the interval clears it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats

CONFIDENCE = 0.95


def t_central_probability(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's T with ``df`` (integer ≥ 1) degrees of freedom."""
    if df < 1 or int(df) != df:
        raise ValueError(f"degrees of freedom must be a positive integer, got {df}")
    return float(2 * stats.t.cdf(abs(t), df) - 1)


def t_quantile(confidence: float, df: int) -> float:
    """The t with P(|T| ≤ t) = ``confidence`` (two-sided), e.g. 2.776 for 95 % and df = 4."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    return float(stats.t.ppf((1 + confidence) / 2, df))


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


def interval_text(v: Sequence[float]) -> str:
    """A (mean, low, high) triple as the reports print it: ``0.512 [0.498, 0.526]``."""
    return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def target_state(interval: Sequence[float], target: float) -> str:
    """A target "at least ``target``" judged on ``(mean, low, high)``: "met" when the interval
    clears it, "missed by" the mean's shortfall when the whole interval lies below it, else
    "not shown" — also for one seed, which has no interval (NaN bounds)."""
    mean, low, high = interval
    if math.isfinite(low) and low >= target:
        return "met"
    if math.isfinite(high) and high < target:
        return f"missed by {target - mean:.3f}"
    return "not shown"
