"""The extra validation trials ``auto`` gives each tuned candidate after its grid (issue 26).

A grid of three values can leave the best at an end: a better value may lie beyond it, and the
choice is then an artefact of the grid. After a candidate's grid trials, each extra trial goes a
grid step past the end the best sits on (widening); when the best sits inside, it goes between
the best and its better-scoring neighbour (refining). Every tuned candidate gets the same number
of extra trials either way, so the comparison between candidates stays equal. Pure functions: the
caller trains and scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# The step past an end when the two values at that end do not give a ratio (an end at 0).
FALLBACK_RATIO = 3.0


def _rounded(value: float, integer: bool) -> float | int:
    return max(1, round(value)) if integer else float(f"{value:.3g}")


def edge(values: Sequence[float], best: int, bound: float | None = None) -> str | None:
    """``"low"`` / ``"high"`` when ``values[best]`` is the lowest / highest value tried and it is
    not the axis's natural end ``bound`` (a weight of 0 is the paper's loss); else None."""
    if len(set(values)) < 2:
        return None
    value = values[best]
    if bound is not None and value == bound:
        return None
    if value == min(values):
        return "low"
    return "high" if value == max(values) else None


def beyond(values: Sequence[float], side: str, integer: bool) -> float | int | None:
    """One step past the ``side`` end of ``values``: the ratio of the two values at that end
    (``FALLBACK_RATIO`` where one is 0), 3 significant digits, integers rounded and at least 1;
    None where nothing new lies there (an integer axis at 1)."""
    ordered = sorted(set(values))
    near, far = (ordered[0], ordered[1]) if side == "low" else (ordered[-1], ordered[-2])
    ratio = max(near, far) / min(near, far) if min(near, far) > 0 else FALLBACK_RATIO
    value = _rounded(near / ratio if side == "low" else near * ratio, integer)
    return None if value in ordered else value


def between(low: float, high: float, integer: bool) -> float | int | None:
    """A value between two tried ones: their geometric mean (the grids are ratio-spaced), the
    arithmetic mean where one is 0; None where nothing new lies between."""
    value = math.sqrt(low * high) if low > 0 and high > 0 else (low + high) / 2
    value = _rounded(value, integer)
    return None if value in (low, high) or not low < value < high else value


def next_value(
    values: Sequence[float],
    keys: Sequence[Any],
    best: int,
    integer: bool,
    bound: float | None = None,
    ceiling: float | None = None,
) -> float | int | None:
    """The next value to try after ``values`` (their comparable scores ``keys``, the best at
    ``best``): past the end the best sits on, else between the best and its better neighbour
    (then the other one); None when no new valid value exists. ``ceiling``: the axis's largest
    sensible value for this data (a rank no wider than the dimensions): a step past it tries
    the ceiling itself, once."""
    side = edge(values, best, bound)
    if side is not None:
        value = beyond(values, side, integer)
        if value is not None and ceiling is not None and value > ceiling:
            capped = _rounded(ceiling, integer)
            return None if capped in values or capped <= max(values) else capped
        return value
    value = values[best]
    below = [i for i, v in enumerate(values) if v < value]
    above = [i for i, v in enumerate(values) if v > value]
    neighbours = [max(below, key=lambda i: values[i])] if below else []
    neighbours += [min(above, key=lambda i: values[i])] if above else []
    for i in sorted(neighbours, key=lambda i: keys[i], reverse=True):
        low, high = sorted((value, values[i]))
        middle = between(low, high, integer)
        if middle is not None and middle not in values:
            return middle
    return None
