"""Intervals over repeated runs: what a benchmark's ± must include to say a target is met."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


def t_interval(
    values: Sequence[float | None], confidence: float = CONFIDENCE
) -> tuple[float, float, float] | None:
    """(mean, low, high) of the finite ``values``: the Student-t interval across runs,
    mean ± t_{(1+confidence)/2, n−1} · sd / √n (sd with ddof = 1).

    Across runs that each draw their own split, the interval includes split sampling as well as
    training noise. None when no value is finite; with one value the interval is that value
    (nothing to say about its spread: callers show it as a single run)."""
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return None
    mean = float(v.mean())
    if v.size == 1:
        return mean, mean, mean
    half = float(stats.t.ppf((1 + confidence) / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return mean, mean - half, mean + half


def clears(interval: tuple[float, float, float], target: float, above: bool = True) -> float:
    """How far the interval's near bound lies past ``target`` (≥ 0: met; < 0: missed by that
    much): the low bound for an at-least target, the high bound for an at-most one."""
    _, low, high = interval
    return low - target if above else target - high
