"""Which estimate of future traffic the backfill plan ranks by: the access counts alone, or with
the service's tally of what searches returned, or with the neighbourhood of heavily clicked items.
Pure: arrays in, the chosen estimate and the evidence out.

The combination is chosen on validation, by how well each estimate, built from one half of the
clicks, predicts the other half (binomial thinning: every click goes to "past" or "future" by a
fair coin; for clicks that arrive as a Poisson process the two halves are independent draws of
the same traffic). On each of ``SPLITS`` splits, every candidate is built from the past half
(its neighbourhood spreads the past clicks; the returned tally is not split, it is not made of
clicks), the plan's ``n`` items are the candidate's top ``n`` among the items not yet
re-embedded, and its score is the share of the future clicks those items hold. A candidate
replaces the counts alone only when it covers more future clicks **on every split**, and by more
than the noise on average (one standard error of a share of the future half's clicks); among
those, the best mean wins. Issue 25 measured why the bar is high: what search returned (nine
hits in ten not what the user chose) ranked no better than random.

Signals, in click units so that weights compare:

* returned: the tally's share of each item × the total clicks (``weight`` 1: as much traffic as
  the clicks again, spread the way search results are);
* neighbourhood: each of the ``HEAVY_ITEMS`` most clicked items passes its clicks, split evenly,
  to its ``NEIGHBOURS`` nearest other items (searches for an item users want often land near it,
  when popularity follows topics; when it does not, validation keeps the counts alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SPLITS = 4
RETURNED_WEIGHTS = (0.25, 1.0, 4.0)
NEIGHBOUR_WEIGHTS = (0.25, 1.0, 4.0)
# Heavily clicked items whose neighbours are looked up (one search each, at plan time).
HEAVY_ITEMS = 256
NEIGHBOURS = 10
# Fewer clicks than this: halves too thin to tell estimates apart; the counts are used alone.
MIN_CLICKS = 20
# Breaks ties between equal estimates by the caller's order without moving unequal ones.
_TIE = 1e-9


@dataclass(frozen=True)
class Neighbourhood:
    """Positions of the heavily clicked items and of their nearest other items (−1: none)."""

    sources: np.ndarray  # (m,) int
    neighbours: np.ndarray  # (m, k) int


def heavy_items(counts: np.ndarray) -> np.ndarray:
    """Positions of the ``HEAVY_ITEMS`` most clicked items (clicked ones only), most first."""
    clicked = np.flatnonzero(np.asarray(counts) > 0)
    return clicked[np.argsort(-np.asarray(counts)[clicked], kind="stable")[:HEAVY_ITEMS]]


def nearest_others(sources: np.ndarray, found: np.ndarray) -> Neighbourhood:
    """The neighbourhood from each source's search results (positions, nearest first, −1 for
    none), the source itself left out, the nearest ``NEIGHBOURS`` others kept."""
    found = np.where(found == np.asarray(sources)[:, None], -1, found)
    order = np.argsort(found < 0, axis=1, kind="stable")
    return Neighbourhood(sources, np.take_along_axis(found, order, axis=1)[:, :NEIGHBOURS])


@dataclass(frozen=True)
class TrafficChoice:
    estimate: np.ndarray  # expected traffic per item, in click units (from all the clicks)
    name: str
    returned_weight: float
    neighbourhood_weight: float
    signals: list[str]
    report: dict[str, Any] = field(default_factory=dict)


def neighbourhood_traffic(counts: np.ndarray, hood: Neighbourhood) -> np.ndarray:
    """Σ over heavy items i with j among i's neighbours of counts[i] / (i's neighbours)."""
    out = np.zeros(len(counts), dtype=np.float64)
    if not len(hood.sources):
        return out
    held = hood.neighbours >= 0
    per = np.asarray(counts, dtype=np.float64)[hood.sources] / np.maximum(held.sum(axis=1), 1)
    np.add.at(out, hood.neighbours[held], np.broadcast_to(per[:, None], held.shape)[held])
    return out


def estimate(
    counts: np.ndarray,
    returned: np.ndarray | None,
    hood: Neighbourhood | None,
    returned_weight: float,
    neighbourhood_weight: float,
) -> np.ndarray:
    """counts + a·(returned share × Σ counts) + b·(neighbourhood traffic)."""
    out = np.asarray(counts, dtype=np.float64).copy()
    total = out.sum()
    if returned_weight and returned is not None and returned.sum() > 0:
        out += returned_weight * total * returned / returned.sum()
    if neighbourhood_weight and hood is not None:
        out += neighbourhood_weight * neighbourhood_traffic(counts, hood)
    return out


def covered(
    values: np.ndarray, future: np.ndarray, allowed: np.ndarray, n: int, tiebreak: np.ndarray
) -> float:
    """Share of ``future`` clicks held by the top ``n`` allowed items by ``values``."""
    total = future.sum()
    if total <= 0 or n <= 0:
        return 0.0
    key = values[allowed] + _TIE * tiebreak[allowed]
    n = min(n, len(key))
    top = np.argpartition(-key, n - 1)[:n] if n < len(key) else np.arange(len(key))
    return float(future[allowed][top].sum() / total)


def _candidates(
    returned: np.ndarray | None, hood: Neighbourhood | None
) -> list[tuple[float, float]]:
    out = [(0.0, 0.0)]
    if returned is not None and returned.sum() > 0:
        out += [(a, 0.0) for a in RETURNED_WEIGHTS]
    if hood is not None and len(hood.sources):
        out += [(0.0, b) for b in NEIGHBOUR_WEIGHTS]
    return out


def _name(a: float, b: float) -> str:
    parts = ["access_counts"]
    if a:
        parts.append(f"search_returned×{a:g}")
    if b:
        parts.append(f"neighbourhood×{b:g}")
    return " + ".join(parts)


def choose_traffic(
    counts: np.ndarray,
    returned: np.ndarray | None,
    hood: Neighbourhood | None,
    exclude: np.ndarray,
    n: int,
    tiebreak: np.ndarray,
    seed: int = 0,
) -> TrafficChoice:
    """The traffic estimate to rank by (see the module docstring) and its validation."""
    counts = np.asarray(counts, dtype=np.int64)
    allowed = ~np.asarray(exclude, dtype=bool)
    options = _candidates(returned, hood)
    report: dict[str, Any] = {"splits": 0, "candidates": [], "rule": _RULE}
    plain = TrafficChoice(
        estimate(counts, None, None, 0.0, 0.0), _name(0, 0), 0.0, 0.0, ["access_counts"], report
    )
    if len(options) == 1:
        report["note"] = "no other signal to combine with the access counts"
        return plain
    if int(counts.sum()) < MIN_CLICKS or n <= 0 or not allowed.any():
        report["note"] = (
            f"not validated: {int(counts.sum())} clicks (at least {MIN_CLICKS} needed) and "
            f"{n} items to plan; the access counts are used alone"
        )
        return plain
    rng = np.random.default_rng(seed)
    scores = np.zeros((SPLITS, len(options)))
    for s in range(SPLITS):
        past = rng.binomial(counts, 0.5)
        future = counts - past
        for c, (a, b) in enumerate(options):
            values = estimate(past, returned, hood, a, b)
            scores[s, c] = covered(values, future, allowed, n, tiebreak)
    gains = scores - scores[:, :1]
    # One standard error of the counts-alone share, over the future half's clicks.
    share = float(scores[:, 0].mean())
    margin = math.sqrt(max(share * (1.0 - share), 1e-12) / max(int(counts.sum()) // 2, 1))
    winners = [
        c for c in range(1, len(options)) if (gains[:, c] > 0).all() and gains[:, c].mean() > margin
    ]
    best = max(winners, key=lambda c: gains[:, c].mean(), default=0)
    report["splits"] = SPLITS
    report["margin"] = margin
    report["candidates"] = [
        {
            "name": _name(a, b),
            "returned_weight": a,
            "neighbourhood_weight": b,
            "covered_future": float(scores[:, c].mean()),
            "gain_min": float(gains[:, c].min()),
        }
        for c, (a, b) in enumerate(options)
    ]
    a, b = options[best]
    signals = (
        ["access_counts"] + (["search_returned"] if a else []) + (["neighbourhood"] if b else [])
    )
    return TrafficChoice(estimate(counts, returned, hood, a, b), _name(a, b), a, b, signals, report)


_RULE = (
    "each candidate is built from a random half of the clicks and scored by the share of the "
    "other half its top items hold; it replaces the counts alone only if better on every split "
    "and by more than the noise (margin) on average"
)
