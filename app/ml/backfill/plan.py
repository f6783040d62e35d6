"""The plan of a partial backfill: which items to re-embed first, and the quality expected at each
re-embedded fraction. Pure: arrays in, arrays out. (The mixed search it simulates is
``app.ml.backfill.mixed``.)

Which items gain most from re-embedding cannot be measured on the gallery (their
new features are what is missing), so it is learned on the upgrade's held-out items, where both
sides exist: each held-out item's gain is the change of a rank discount, 1/log₂(2 + rank), of
its queries' (or, without a query log, its own new features') rank when the item is scored
natively instead of bridged; a ridge regression from the item's old point (its gallery-frame
coordinates and its cosine to the mean direction) predicts it for every gallery item in one
matrix–vector product (a million items in well under a second). The alternative the issue names,
uncertainty (HBCT's norm uncertainty, or the share of an item's old neighbours with another
label), is scored on the same held-out data by cross-fitting; ``fit_planner`` keeps whichever
estimator's simulated curve is higher, and reports both. The curve is the simulated quality at
each re-embedded fraction on the held-out queries, with the fit gallery re-embedded in the
estimator's order (cross-fitted predictions for the held-out items).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.ml.backfill.mixed import (
    CALIBRATION,
    MERGE_RULE,
    NO_MAPS,
    Maps,
    calibrated_scores,
    merged_ranks,
    unit_rows,
)
from app.ml.backfill.relevance import RelevanceMap, fit_relevance

# Fractions the expected curve always reports (plus the request's own).
CURVE_FRACTIONS: tuple[float, ...] = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)
RIDGE_LAMBDA = 10.0
# Held-out queries and fit-gallery items a planner fit uses at most (seeded samples beyond).
MAX_FIT_QUERIES = 2000
MAX_FIT_ITEMS = 50_000
ESTIMATORS = ("expected_gain", "uncertainty", "random")


def discount(ranks: np.ndarray) -> np.ndarray:
    return 1.0 / np.log2(2.0 + np.asarray(ranks, dtype=np.float64))


def gain_features(points: np.ndarray, mean_direction: np.ndarray) -> np.ndarray:
    """Per item: its unit old point, its cosine to the gallery's mean direction, and 1."""
    x = unit_rows(points)
    return np.concatenate(
        [x, (x @ mean_direction.astype(np.float32))[:, None], np.ones((len(x), 1), np.float32)],
        axis=1,
    )


@dataclass
class GainModel:
    """Ridge weights over ``gain_features`` and the mean direction they use."""

    weights: np.ndarray
    mean_direction: np.ndarray

    def predict(self, points: np.ndarray, block: int = 262_144) -> np.ndarray:
        """``gain_features(points) @ weights`` without building the features: with x̂ = x/‖x‖,
        w·(x̂, x̂·m, 1) = (x·(w_x + w_m m))/‖x‖ + w_1, one product and one norm per item (the
        plan of a million items spent most of its time copying the features)."""
        d = len(self.mean_direction)
        folded = (self.weights[:d] + self.weights[d] * self.mean_direction).astype(np.float32)
        out = np.empty(len(points), dtype=np.float32)
        for start in range(0, len(points), block):
            x = np.asarray(points[start : start + block], dtype=np.float32)
            norms = np.sqrt(np.einsum("ij,ij->i", x, x))
            out[start : start + block] = (x @ folded) / np.maximum(norms, 1e-12) + self.weights[
                d + 1
            ]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"weights": self.weights.tolist(), "mean_direction": self.mean_direction.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GainModel:
        return cls(
            np.asarray(data["weights"], dtype=np.float64),
            np.asarray(data["mean_direction"], dtype=np.float64),
        )


def fit_gain_model(
    points: np.ndarray, gains: np.ndarray, mean_direction: np.ndarray, lam: float = RIDGE_LAMBDA
) -> GainModel:
    x = gain_features(points, mean_direction).astype(np.float64)
    a = x.T @ x + lam * np.eye(x.shape[1])
    return GainModel(np.linalg.solve(a, x.T @ np.asarray(gains, np.float64)), mean_direction)


def plan_order(priority: np.ndarray, exclude: np.ndarray | None = None) -> np.ndarray:
    """Positions by descending priority (ties by position), without the excluded ones."""
    priority = np.asarray(priority, dtype=np.float64)
    keep = np.arange(len(priority)) if exclude is None else np.flatnonzero(~exclude)
    return keep[np.argsort(-priority[keep], kind="stable")]


@dataclass
class FitView:
    """Held-out data of one upgrade in the gallery's frame, as the planner needs it.

    ``native``/``bridged``: nq × n scores of held-out queries against the fit gallery (the
    upgrade's paired items: their new features, and their old points); ``relevant``: per query
    the rows it is about; ``old_points``: n × d gallery-frame points of the fit gallery;
    ``held_out``: rows of the held-out items; ``view``: "query" or "instance"."""

    native: np.ndarray
    bridged: np.ndarray
    relevant: list[np.ndarray]
    old_points: np.ndarray
    held_out: np.ndarray
    view: str
    # The two lists' reference tails (``reference_fit`` over the reference columns).
    fits: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]
    uncertainty: np.ndarray | None = None  # n, larger = less certain old embedding
    # A transition search's old list, where the held-out queries carry the old model's vectors:
    # nq × n Lorentz scores of the lifted old queries against the old points, and its tail.
    old: np.ndarray | None = None
    old_fit: tuple[np.ndarray, ...] | None = None
    # Columns before this one have new features and can be re-embedded; the rest are the
    # gallery's unpaired items (native scores −inf), in the old space at every share. None: all.
    reembeddable: int | None = None
    # What the view searched (counts, whether sampled), for the fit's validation.
    searched: dict[str, Any] | None = None

    @property
    def n_reembeddable(self) -> int:
        n = self.native.shape[1]
        return n if self.reembeddable is None else self.reembeddable


def item_gains(
    view: FitView, rule: str = MERGE_RULE, maps: Maps = NO_MAPS
) -> tuple[np.ndarray, np.ndarray]:
    """(gain per fit-gallery row, mask of rows the gain is measured for)."""
    n = view.native.shape[1]
    gains = np.zeros(n)
    seen = np.zeros(n, dtype=bool)
    none = np.zeros(n, dtype=bool)
    all_new = np.zeros(n, dtype=bool)
    all_new[: view.n_reembeddable] = True
    args = (view.relevant, view.fits, rule, maps)
    r_native = merged_ranks(view.native, view.bridged, all_new, *args)
    r_bridged = merged_ranks(view.native, view.bridged, none, *args)
    delta = discount(r_native) - discount(r_bridged)
    for q, rel in enumerate(view.relevant):
        gains[rel] += delta[q] / len(rel)
        seen[rel] = True
    return gains, seen


def curve(
    view: FitView,
    order: np.ndarray,
    fractions: Sequence[float],
    ks: Sequence[int] = (1, 10),
    rule: str = MERGE_RULE,
    maps: Maps = NO_MAPS,
    transition: bool = False,
) -> list[dict[str, Any]]:
    """Recall@k of the held-out queries with the first ``fraction`` of ``order`` re-embedded:
    the bridged mixed search, or with ``transition`` the transition search (the old model's
    query vectors for the items not re-embedded; the view must hold them). ``order`` ranks the
    re-embeddable columns (``FitView.n_reembeddable``); ``fraction`` is a share of them."""
    n = view.native.shape[1]
    reembeddable = view.n_reembeddable
    other, fits = view.bridged, view.fits
    if transition:
        assert view.old is not None and view.old_fit is not None
        other, fits = view.old, (view.fits[0], view.old_fit)
    out = []
    for fraction in fractions:
        mask = np.zeros(n, dtype=bool)
        mask[order[: round(fraction * reembeddable)]] = True
        ranks = merged_ranks(view.native, other, mask, view.relevant, fits, rule, maps)
        out.append(
            {"fraction": float(fraction), **{f"recall@{k}": float((ranks < k).mean()) for k in ks}}
        )
    return out


def area(points: list[dict[str, Any]], metric: str) -> float:
    """Trapezoid area under metric(fraction): one number to compare orders by."""
    xs = np.array([p["fraction"] for p in points])
    ys = np.array([p[metric] for p in points])
    return float(np.sum((xs[1:] - xs[:-1]) * (ys[1:] + ys[:-1]) / 2))


@dataclass
class PlannerFit:
    """What planning needs: the chosen estimator, its gain model, and the expected curve."""

    estimator: str
    gain_model: GainModel
    view: str
    metric: str
    expected: list[dict[str, Any]]
    validation: dict[str, Any] = field(default_factory=dict)
    # Each list's P̂(relevant | c) ("native", "bridged", "old"; None where not fitted): what the
    # service's merges use when ``CALIBRATION`` is "relevance".
    relevance: dict[str, RelevanceMap | None] = field(default_factory=dict)
    # The transition search's expected curve with a random re-embedded share (where the
    # held-out queries carry the old model's vectors), like ``expected``.
    transition: list[dict[str, Any]] | None = None

    def maps(self, other: str) -> Maps:
        """The maps of a merge of the native list with ``other`` ("bridged" or "old")."""
        if CALIBRATION != "relevance":
            return NO_MAPS
        return (self.relevance.get("native"), self.relevance.get(other))

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimator": self.estimator,
            "gain_model": self.gain_model.to_dict(),
            "view": self.view,
            "metric": self.metric,
            "expected": self.expected,
            "validation": self.validation,
            "relevance": {k: None if m is None else m.to_dict() for k, m in self.relevance.items()},
            "transition": self.transition,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlannerFit:
        return cls(
            estimator=data["estimator"],
            gain_model=GainModel.from_dict(data["gain_model"]),
            view=data["view"],
            metric=data["metric"],
            expected=list(data["expected"]),
            validation=dict(data.get("validation", {})),
            relevance={
                k: None if m is None else RelevanceMap.from_dict(m)
                for k, m in data.get("relevance", {}).items()
            },
            transition=data.get("transition"),
        )


def fit_planner(
    view: FitView,
    seed: int = 0,
    fractions: Sequence[float] = CURVE_FRACTIONS,
    rule: str = MERGE_RULE,
    calibration: str = CALIBRATION,
):
    """Learn the per-item gain on the held-out items, compare estimators by cross-fitting, and
    estimate the curve of the chosen one (merged per ``calibration``). Returns a
    ``PlannerFit``."""
    rng = np.random.default_rng([seed, 12])
    relevance = relevance_maps(view)
    maps = (relevance["native"], relevance["bridged"]) if calibration == "relevance" else NO_MAPS
    gains, seen = item_gains(view, rule, maps)
    measured = view.held_out[seen[view.held_out]]
    if len(measured) < 4:
        raise ValueError("too few held-out items with queries to learn which items gain most")
    # Only the re-embeddable columns can be re-embedded in a simulation; the gain model is
    # learned on them (the unpaired items in the view are distractors).
    g = view.n_reembeddable
    paired_points = view.old_points[:g]
    mean_direction = unit_rows(paired_points.mean(axis=0, keepdims=True))[0].astype(np.float64)
    folds = rng.permutation(measured)
    halves = (np.sort(folds[: len(folds) // 2]), np.sort(folds[len(folds) // 2 :]))
    # Cross-fitted predictions: each half scored by the model fitted on the other half, the rest
    # of the fit gallery by the model fitted on all held-out items.
    full = fit_gain_model(view.old_points[measured], gains[measured], mean_direction)
    predicted = full.predict(paired_points).astype(np.float64)
    for train, test in ((halves[0], halves[1]), (halves[1], halves[0])):
        part = fit_gain_model(view.old_points[train], gains[train], mean_direction)
        predicted[test] = part.predict(view.old_points[test])
    metric = "recall@10"
    orders = {
        "expected_gain": plan_order(predicted),
        "random": rng.permutation(g),
    }
    if view.uncertainty is not None and np.ptp(view.uncertainty[:g]) > 1e-6:
        orders["uncertainty"] = plan_order(view.uncertainty[:g])
    curves = {
        name: curve(view, order, fractions, rule=rule, maps=maps) for name, order in orders.items()
    }
    areas = {name: area(points, metric) for name, points in curves.items()}
    learned = [name for name in orders if name != "random"]
    chosen = max(learned, key=lambda name: areas[name])
    correlation = float(np.corrcoef(predicted[measured], gains[measured])[0, 1])
    expected = [
        {"fraction": p["fraction"], "metric": key, "value": p[key]}
        for p in curves[chosen]
        for key in ("recall@1", "recall@10")
    ]
    validation = {
        "view": view.view,
        "held_out_items": len(measured),
        "queries": len(view.relevant),
        "gain_correlation": correlation,
        "area": areas,
        "curves": curves,
        "chosen": chosen,
    }
    if view.searched is not None:
        validation["searched"] = view.searched
    transition = None
    if view.old is not None:
        old_maps = (
            (relevance["native"], relevance["old"]) if CALIBRATION == "relevance" else NO_MAPS
        )
        points = curve(view, orders["random"], fractions, rule=rule, maps=old_maps, transition=True)
        transition = [
            {"fraction": p["fraction"], "metric": key, "value": p[key]}
            for p in points
            for key in ("recall@1", "recall@10")
        ]
    return PlannerFit(chosen, full, view.view, metric, expected, validation, relevance, transition)


def plan_priority(fit: PlannerFit, points: np.ndarray, uncertainty: np.ndarray | None = None):
    """Per gallery item, how much re-embedding it is expected to buy (larger first)."""
    if fit.estimator == "uncertainty":
        if uncertainty is None:
            raise ValueError("the uncertainty estimator needs the items' uncertainty")
        return np.asarray(uncertainty, dtype=np.float64)
    return fit.gain_model.predict(points)


def expected_at(fit: PlannerFit, fraction: float) -> list[dict[str, Any]]:
    """The fitted curve at its own fractions plus ``fraction`` (linear between neighbours)."""
    out = [dict(p) for p in fit.expected]
    known = {p["fraction"] for p in out}
    if fraction not in known:
        for metric in sorted({p["metric"] for p in out}):
            pts = sorted((p["fraction"], p["value"]) for p in out if p["metric"] == metric)
            xs, ys = zip(*pts, strict=True)
            value = float(np.interp(fraction, xs, ys))
            out.append({"fraction": float(fraction), "metric": metric, "value": value})
    return sorted(out, key=lambda p: (p["fraction"], p["metric"]))


def relevance_maps(view: FitView) -> dict[str, RelevanceMap | None]:
    """Each list's P̂(relevant | c) fitted on the view's held-out queries
    (``app.ml.backfill.relevance``): native, bridged and (with the old model's query vectors)
    old. The instance view has no queries of its own, so no maps (the merge is on c alone)."""
    if view.view != "query":
        return {"native": None, "bridged": None, "old": None}
    lists = {"native": (view.native, view.fits[0]), "bridged": (view.bridged, view.fits[1])}
    if view.old is not None and view.old_fit is not None:
        lists["old"] = (view.old, view.old_fit)
    out: dict[str, RelevanceMap | None] = {"old": None}
    for name, (scores, fit) in lists.items():
        out[name] = fit_relevance(calibrated_scores(scores, fit), view.relevant)
    return out
