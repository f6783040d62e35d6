"""What a calibrated score means for relevance, per space: P(relevant | c), fitted monotone on
an upgrade's held-out queries. Pure: arrays in, arrays out.

The tail calibration (``app.ml.backfill.mixed``) puts both lists of a mixed or transition search
on one scale, c = −ln(share of a reference sample scoring above), so an item's c says how
unusual its score is *for that query in that space*. It does not say how often such an item is
what the user wanted: when the new model is the better one, its c = 5 is relevant more often
than the old model's c = 5, and a merge on c alone gives each space the same say. The map
fitted here closes that gap where the upgrade holds queries with known relevant items: for each
space, the held-out queries' best ``CANDIDATES`` items by c, labelled relevant or not, fitted by
isotonic regression (pool-adjacent-violators) after pooling into at most ``BINS`` quantile bins
of c. The merged key is

    key(c) = P̂(relevant | c) + TIE_WEIGHT · arctan(c) / (π/2)

— P̂ is non-decreasing in c and the second term strictly increasing, so within one list the key
orders items exactly as c (and as the raw score) does: at 0 % or 100 % re-embedded a search is
still exactly the one-space ranking, whatever the map's error; only where two lists meet does
P̂ decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Best items per held-out query and space that the map is fitted on: where merges are decided
# (a result page and its neighbourhood); the rest of a list never meets the other one.
CANDIDATES = 100
# Quantile bins of c pooled before the isotonic fit (bounds what is stored with a model).
BINS = 200
# Fewer relevant items than this among a space's candidates and the map is not fitted (a
# handful of positives make a step function of noise): the merge is then on c alone.
MIN_POSITIVES = 20
# Weight of c in the merged key: small enough never to reorder items whose P̂ differ by more than
# 1e-6, large enough to order float64 keys of equal P̂ by c.
TIE_WEIGHT = 1e-6


def isotonic(
    x: np.ndarray, y: np.ndarray, w: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Non-decreasing weighted least-squares fit of y on x (pool-adjacent-violators over the
    sorted, distinct x; equal x pooled first). Returns knots (xs strictly increasing, ys
    non-decreasing): each pooled block contributes its first and last x at the block's mean."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.size == 0:
        raise ValueError("isotonic: no points")
    w = np.ones_like(x) if w is None else np.asarray(w, dtype=np.float64)
    ux, inverse = np.unique(x, return_inverse=True)
    weight = np.bincount(inverse, weights=w)
    mean = np.bincount(inverse, weights=w * y) / weight
    # Blocks as stacks: sum of w·y, sum of w, first and last distinct-x index.
    sums: list[float] = []
    weights: list[float] = []
    firsts: list[int] = []
    lasts: list[int] = []
    for i in range(len(ux)):
        sums.append(mean[i] * weight[i])
        weights.append(weight[i])
        firsts.append(i)
        lasts.append(i)
        while len(sums) > 1 and sums[-2] / weights[-2] > sums[-1] / weights[-1]:
            s, wt, last = sums.pop(), weights.pop(), lasts.pop()
            firsts.pop()
            sums[-1] += s
            weights[-1] += wt
            lasts[-1] = last
    xs: list[float] = []
    ys: list[float] = []
    for s, wt, first, last in zip(sums, weights, firsts, lasts, strict=True):
        xs.append(float(ux[first]))
        ys.append(s / wt)
        if last != first:
            xs.append(float(ux[last]))
            ys.append(s / wt)
    return np.asarray(xs), np.asarray(ys)


@dataclass(frozen=True)
class RelevanceMap:
    """P̂(relevant | c) of one space: knots of a non-decreasing piecewise-linear function,
    constant beyond its ends."""

    xs: np.ndarray
    ys: np.ndarray
    positives: int
    candidates: int

    def probability(self, calibrated: np.ndarray) -> np.ndarray:
        c = np.asarray(calibrated, dtype=np.float64)
        return np.interp(np.nan_to_num(c, nan=-np.inf), self.xs, self.ys)

    def to_dict(self) -> dict[str, Any]:
        return {
            "xs": self.xs.tolist(),
            "ys": self.ys.tolist(),
            "positives": self.positives,
            "candidates": self.candidates,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RelevanceMap:
        return cls(
            np.asarray(data["xs"], dtype=np.float64),
            np.asarray(data["ys"], dtype=np.float64),
            int(data["positives"]),
            int(data["candidates"]),
        )


def merge_key(calibrated: np.ndarray, relevance: RelevanceMap | None) -> np.ndarray:
    """The key a merge orders by (larger first): c itself without a map, else
    P̂(relevant | c) + TIE_WEIGHT · arctan(c)/(π/2). −inf (padding) stays −inf."""
    c = np.asarray(calibrated, dtype=np.float64)
    if relevance is None:
        return c
    key = relevance.probability(c) + TIE_WEIGHT * np.arctan(c) / (np.pi / 2)
    return np.where(np.isneginf(c), -np.inf, key)


def fit_relevance(
    calibrated: np.ndarray,
    relevant: Sequence[np.ndarray],
    candidates: int = CANDIDATES,
    bins: int = BINS,
    min_positives: int = MIN_POSITIVES,
) -> RelevanceMap | None:
    """The map of one space from its calibrated scores (nq × n, over a gallery where
    ``relevant[q]`` are query q's relevant columns); None with fewer than ``min_positives``
    relevant items among the candidates."""
    c = np.asarray(calibrated, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] != len(relevant) or c.shape[0] == 0:
        raise ValueError("calibrated scores must be queries × items, one row per query")
    k = min(candidates, c.shape[1])
    top = np.argpartition(-c, k - 1, axis=1)[:, :k]
    values = np.take_along_axis(c, top, axis=1)
    labels = np.zeros(top.shape, dtype=np.float64)
    for q, rel in enumerate(relevant):
        labels[q] = np.isin(top[q], np.asarray(rel, dtype=np.int64))
    finite = np.isfinite(values)
    values, labels = values[finite], labels[finite]
    positives = int(labels.sum())
    if positives < min_positives:
        return None
    # Quantile bins of c (pooled means) keep the stored map small; PAV on the bins.
    order = np.argsort(values, kind="stable")
    values, labels = values[order], labels[order]
    groups = np.array_split(np.arange(len(values)), min(bins, len(values)))
    centre = np.array([values[g].mean() for g in groups])
    rate = np.array([labels[g].mean() for g in groups])
    size = np.array([len(g) for g in groups], dtype=np.float64)
    xs, ys = isotonic(centre, rate, size)
    return RelevanceMap(xs, ys, positives, int(labels.size))
