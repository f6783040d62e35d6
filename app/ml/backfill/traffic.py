"""The plan's order when a gallery has access counts, how its learned order compares with random,
and why an expected curve may fall. Pure: arrays and the stored validation in, plain data out.

Ranking by value (``value_order``): an item's value is its expected gain × its expected traffic.

* Traffic: an item's share of the clicks with a prior of ``TRAFFIC_PRIOR`` clicks for every item,
  ``(count + ½) / (Σ counts + ½ n)``: an item clicked once is three times an unclicked one, and
  every unclicked item has the same small traffic, so they stay ordered by gain among themselves.
* Gain: the learned per-item gain (or uncertainty) is on no scale the traffic shares, and it is
  weakly predictive (issue 25: correlation 0.01–0.09 with the true gain), so only its rank is
  used: a factor from ½ (lowest) to 1 (highest). Traffic therefore decides between items whose
  counts differ by more than 2×, and gain decides among items of similar traffic.
* When the plan's own validation says the learned order is no better than random
  (``versus_random``), the factor would only add noise to the traffic: the order is then by
  traffic alone, the gain breaking ties (equal counts, unclicked items).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Pseudo-clicks of every item: a floor, so unclicked items keep an order (by gain) and a single
# click counts for more than none without making it a sure thing.
TRAFFIC_PRIOR = 0.5
# The gain factor spans [1 − GAIN_BAND, 1]: how much a confident gain may reorder traffic.
GAIN_BAND = 0.5
VALIDATION_METRIC = "recall@10"


def gain_rank(gain: np.ndarray) -> np.ndarray:
    """Each item's rank by gain as a share in (0, 1]: 1 for the largest."""
    ranks = np.empty(len(gain), dtype=np.float64)
    ranks[np.argsort(np.asarray(gain, dtype=np.float64), kind="stable")] = np.arange(
        1, len(gain) + 1
    )
    return ranks / max(len(gain), 1)


def traffic_share(counts: np.ndarray) -> np.ndarray:
    """(count + prior) / (Σ counts + prior · n): expected traffic, never zero."""
    counts = np.asarray(counts, dtype=np.float64)
    return (counts + TRAFFIC_PRIOR) / (counts.sum() + TRAFFIC_PRIOR * len(counts))


def value_order(
    gain: np.ndarray,
    counts: np.ndarray,
    gain_validated: bool,
    exclude: np.ndarray | None = None,
) -> np.ndarray:
    """Positions by descending expected gain × traffic (see the module docstring), without the
    excluded ones; ties by gain, then by position."""
    rank = gain_rank(gain)
    traffic = traffic_share(counts)
    value = traffic * (1.0 - GAIN_BAND + GAIN_BAND * rank) if gain_validated else traffic
    keep = np.arange(len(value)) if exclude is None else np.flatnonzero(~exclude)
    # lexsort: the last key sorts first; stable, so equal keys keep their positions' order.
    return keep[np.lexsort((-rank[keep], -value[keep]))]


def _interp(curve: list[dict[str, Any]], fraction: float, metric: str) -> float:
    xs = [p["fraction"] for p in curve]
    ys = [p[metric] for p in curve]
    return float(np.interp(fraction, xs, ys))


def noise(value: float, queries: int) -> float:
    """One standard error of a recall measured on ``queries`` queries, √(p(1 − p)/n): the
    scale below which two held-out figures are not told apart."""
    if queries <= 0:
        return math.inf
    p = min(max(value, 0.0), 1.0)
    return math.sqrt(max(p * (1.0 - p), 1.0 / queries) / queries)


def versus_random(validation: dict[str, Any], fraction: float) -> dict[str, Any] | None:
    """The chosen learned order against a random one, from the cross-fitted curves the planner
    stored (no new simulation): the difference of their areas under recall@10, the difference
    at ``fraction``, and the noise margin (one standard error of recall@10 on the held-out
    queries; the two curves share their queries, so this is conservative). ``better``: the area
    beats random by more than the margin. None for a fit without those curves."""
    areas = validation.get("area") or {}
    curves = validation.get("curves") or {}
    chosen = validation.get("chosen")
    if chosen not in areas or "random" not in areas or chosen not in curves:
        return None
    random_curve = curves["random"]
    level = float(np.mean([p[VALIDATION_METRIC] for p in random_curve]))
    margin = noise(level, int(validation.get("queries") or 0))
    area = float(areas[chosen] - areas["random"])
    at = _interp(curves[chosen], fraction, VALIDATION_METRIC) - _interp(
        random_curve, fraction, VALIDATION_METRIC
    )
    return {
        "metric": VALIDATION_METRIC,
        "estimator": chosen,
        "area": area,
        "fraction": float(fraction),
        "at_fraction": float(at),
        "margin": margin,
        "better": area > margin,
    }


def no_better_warning(compared: dict[str, Any], with_traffic: bool) -> str | None:
    """The plan's warning when its learned order is no better than random, else None."""
    if compared["better"]:
        return None
    then = (
        "The order follows the access counts; the learned gain only breaks ties."
        if with_traffic
        else "Re-embed in any order, or upload access counts (POST /v1/galleries/{id}/access) "
        "so the plan can follow what users open."
    )
    return (
        f"The learned order ({compared['estimator']}) is no better than random on the "
        f"upgrade's held-out data: area under {compared['metric']} {compared['area']:+.4f} "
        f"over random, {compared['at_fraction']:+.4f} at {compared['fraction']:.1%} (noise "
        f"±{compared['margin']:.4f}). {then}"
    )


def expected_note(expected: list[dict[str, Any]], queries: int) -> str | None:
    """Why the expected curve falls somewhere (None where every metric rises or stays): the
    figures are held-out measurements, reported as measured rather than smoothed."""
    notes = []
    for metric in sorted({p["metric"] for p in expected}):
        points = sorted((p["fraction"], p["value"]) for p in expected if p["metric"] == metric)
        best_x, best_y, drop = points[0][0], points[0][1], (0.0, 0.0, 0.0, 0.0)
        for x, y in points[1:]:
            if best_y - y > drop[0]:
                drop = (best_y - y, best_x, best_y, x)
            if y > best_y:
                best_x, best_y = x, y
        size, x0, y0, x1 = drop
        if size <= 0:
            continue
        margin = noise(y0, queries)
        why = (
            f"within the held-out noise (±{margin:.4f})"
            if size <= margin
            else f"more than the held-out noise (±{margin:.4f}): while part of the gallery is "
            "re-embedded, a search merges two models' lists, and the merge can cost more than "
            "the re-embedded items gain"
        )
        notes.append(
            f"{metric} falls from {y0:.4f} at {x0:.1%} to {y0 - size:.4f} at {x1:.1%}, {why}"
        )
    if not notes:
        return None
    return "; ".join(notes) + ". The curve is measured on held-out queries, not smoothed."
