"""Partial backfill: search a gallery that is partly re-embedded by the new backbone, and plan
which items to re-embed first. Pure: arrays in, arrays out.

**One gallery, two lists, one scale.** A re-embedded item is scored *natively* — the cosine of
the new backbone's query features and the item's new features, exactly what a full reindex
computes — and every other item by the bridged query against its old vector (the gallery's own
score). Each list is ranked in its own space; what merges them is an estimate of the same
quantity for both: the share of the gallery that would score above the item if every item were
scored the way this one is. Per query and per list, the upper tail of the scores above the
(m+1)-th best is modelled as exponential (peaks-over-threshold with the mean excess as scale):

    P̂(S > s) = (m / n) · exp(−(s − u) / σ),   u = the (m+1)-th best score, σ = mean(top m − u)

and the calibrated score is c = −ln P̂ (larger is nearer). Both lists' scores have a known
upper end e (a cosine ≤ 1; a Lorentz inner product ≤ −1/curv, reached at the query's own point),
and near it the tail is not exponential: the share of items within distance δ of the end falls
like a power of δ (δ^((d−1)/2) for cosines in d dimensions), so an exponential gives the end
itself a finite, modest c — in 6 dimensions an item re-embedded with the query's own features
ranked below bridged items. So the fit is made on t = −ln(e − s), where a power law is
exponential: P̂(S > s) = (m/n) · ((e − s)/(e − u))^α, the Hill estimator for 1/α, and c → ∞ at
the end (bounded by the float tolerance, ``EXACT_TOLERANCE``). Far from the end (high-d
embeddings, where the best cosines are far below 1) t is nearly affine in s and the fit is
the plain exponential one. Why this and not a fitted mapping:

- it is *per query*: the two spaces' score ranges differ by query (a short lemma has flat cosines
  everywhere, a specific one a sharp peak), which one global map fitted at upgrade time cannot
  follow; on the public lemma→gloss task a per-query z-score merged 5–10 % of the gallery at
  *below* the bridge's own R@10 and ~0.02 below the linear interpolation at 25–50 %, the tail
  estimate lands on the interpolation (see bench.backfill);
- within a list c is increasing in the score, so at 100 % re-embedded the order *is* the native
  order: a full reindex exactly (and at 0 % exactly the bridge), whatever the calibration's error;
- it needs nothing stored with the model and no held-out data at search time.

A re-embedded item is scored by its native calibrated score alone (``MERGE_RULE``). The
alternatives — also letting its bridged score vouch for it (the max of the two), or averaging the
two estimates of the same −ln share — were compared on a validation carve of the training synsets
(``python -m bench.backfill --validation --merge native,max,mean``): none was better by more than
the benchmark's resolution, and only ``native`` keeps 100 % exactly a reindex and needs no
bridged score for re-embedded items (BENCHMARKS.md, bench.backfill).

Both lists' tails are fitted per query on the same reference documents (a seeded sample of the
upgrade's paired items, both sides: ``REFERENCE_SIZE``), so both estimate a share of one
population; re-embedded items are dropped from the bridged list, since their native score
replaces it.

**The plan.** Which items gain most from re-embedding cannot be measured on the gallery (their
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

# Tail size m of the per-query exponential fit. 100 kept the merge on the linear interpolation of
# the two lists on the public task (20 and 50 within 0.003 of it); the estimate needs ≥ 2 items.
TAIL_SIZE = 100
# Reference documents (a seeded sample of the upgrade's paired items, both sides) on which each
# query's two tails are fitted: one population for both lists, so their estimates agree.
REFERENCE_SIZE = 2048
# Fractions the expected curve always reports (plus the request's own).
CURVE_FRACTIONS: tuple[float, ...] = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0)
# Scores within this share of (1 + |e|) of their list's upper end e are exact matches (float32
# rounding of a cosine of equal vectors, of a Lorentz product of equal points): they tie at the top.
EXACT_TOLERANCE = 1e-6
COSINE_END = 1.0
RIDGE_LAMBDA = 10.0
# Held-out queries and fit-gallery items a planner fit uses at most (seeded samples beyond).
MAX_FIT_QUERIES = 2000
MAX_FIT_ITEMS = 50_000
# Queries × items scored at once while simulating (bounds the float32 working set, 256 MiB).
SCORE_BUDGET = 2**26
ESTIMATORS = ("expected_gain", "uncertainty", "random")
# How a re-embedded item is scored in a mixed gallery: its native calibrated score alone, or
# combined with its bridged one (max: either list may vouch for it; mean: two estimates of the
# same −ln share averaged). bench.backfill --validation compares them on training data.
MERGE_RULES = ("native", "max", "mean")
MERGE_RULE = "native"


def unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


# -- the calibrated merge ---------------------------------------------------------------------


def lorentz_end(curv: float) -> float:
    """The largest Lorentz inner product ⟨q, x⟩_L of two points of curvature −curv (q = x)."""
    return -1.0 / curv


def tail_scale(scores: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The score on which the tail is exponential: −ln(e − s) where the end e is known (finite),
    s itself where it is not (NaN)."""
    s = np.asarray(scores, dtype=np.float64)
    e = np.asarray(end, dtype=np.float64)[:, None]
    bounded = np.isfinite(e)
    e0 = np.where(bounded, e, 0.0)
    gap = np.maximum(e0 - s, EXACT_TOLERANCE * (1.0 + np.abs(e0)))
    with np.errstate(invalid="ignore"):
        return np.where(bounded, np.where(np.isfinite(s), -np.log(gap), s), s)


def tail_fit(
    top_scores: np.ndarray, population: int, m: int = TAIL_SIZE, end: float | None = None
) -> tuple[np.ndarray, ...]:
    """Per row of ``top_scores`` (nq × ≥1, best first, NaN/−inf padded): (u, σ, ln(m/n), e) of
    the exponential tail above the (m+1)-th best of a list of ``population`` items, on
    ``tail_scale`` of the scores (``end``: the scores' upper end, None when unbounded)."""
    top = np.asarray(top_scores, dtype=np.float64)
    nq = top.shape[0]
    ends = np.full(nq, np.nan if end is None else float(end))
    top = tail_scale(top, ends)
    avail = np.isfinite(top).sum(axis=1) if top.size else np.zeros(nq, dtype=np.int64)
    m_eff = np.clip(np.minimum(avail - 1, min(m, max(population - 1, 0))), 0, None)
    rows = np.arange(nq)
    safe = np.where(np.isfinite(top), top, 0.0)
    u = np.where(avail > 0, safe[rows, np.minimum(m_eff, np.maximum(avail - 1, 0))], 0.0)
    cols = np.arange(top.shape[1])[None, :]
    in_tail = cols < m_eff[:, None]
    excess = np.where(in_tail, safe - u[:, None], 0.0).sum(axis=1)
    sigma = np.where(m_eff > 0, excess / np.maximum(m_eff, 1), 0.0)
    # A flat tail (ties) or one item: a tiny scale keeps the order and puts ties together.
    sigma = np.maximum(sigma, 1e-6)
    # With no tail the best item alone is known: half a rank of n.
    share = np.where(m_eff > 0, m_eff / max(population, 1), 0.5 / max(population, 1))
    return u, sigma, np.log(share), ends


def calibrate(scores: np.ndarray, fit: tuple[np.ndarray, ...]) -> np.ndarray:
    """c = −ln P̂(S > s) for scores (nq × k) of one list (larger is nearer)."""
    u, sigma, log_share, ends = fit
    t = tail_scale(scores, ends)
    return -(log_share[:, None] - (t - u[:, None]) / sigma[:, None])


@dataclass(frozen=True)
class Candidates:
    """One list's best items per query (nq × k', best first; id −1 / score −inf pads) and the
    tail fitted on its reference scores."""

    ids: np.ndarray
    scores: np.ndarray
    fit: tuple[np.ndarray, ...]


def pick_reference(n: int, seed: int = 0, size: int = REFERENCE_SIZE) -> np.ndarray:
    """Sorted rows of the reference sample among ``n`` paired items."""
    if n <= size:
        return np.arange(n)
    return np.sort(np.random.default_rng([seed, 1212]).choice(n, size, replace=False))


def reference_fit(
    reference_scores: np.ndarray, m: int = TAIL_SIZE, end: float | None = None
) -> tuple[np.ndarray, ...]:
    """The tail of each query's scores over the reference documents (nq × r); ``end``: the
    scores' upper end (None: unbounded)."""
    _, top = top_of(np.asarray(reference_scores), m + 1)
    return tail_fit(top, reference_scores.shape[1], m, end)


def merge(native: Candidates, bridged: Candidates, k: int):
    """Merged top-k per query: (ids, calibrated scores, from_native) arrays nq × k (pads: id −1).
    ``bridged`` must already exclude re-embedded items."""
    parts = []
    for cand, is_native in ((native, True), (bridged, False)):
        if cand.ids.size == 0:
            continue
        c = np.where(cand.ids >= 0, calibrate(cand.scores, cand.fit), -np.inf)
        parts.append((cand.ids, c, np.full(cand.ids.shape, is_native)))
    nq = max(native.ids.shape[0], bridged.ids.shape[0])
    if not parts:
        return (
            np.full((nq, k), -1, dtype=np.int64),
            np.full((nq, k), -np.inf),
            np.zeros((nq, k), dtype=bool),
        )
    ids = np.concatenate([p[0] for p in parts], axis=1)
    c = np.concatenate([p[1] for p in parts], axis=1)
    src = np.concatenate([p[2] for p in parts], axis=1)
    # Stable on ties: native first (it is the new model's own judgement).
    order = np.argsort(-c, axis=1, kind="stable")[:, :k]
    ids, c, src = (np.take_along_axis(a, order, axis=1) for a in (ids, c, src))
    if ids.shape[1] < k:
        pad = k - ids.shape[1]
        ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=-1)
        c = np.pad(c, ((0, 0), (0, pad)), constant_values=-np.inf)
        src = np.pad(src, ((0, 0), (0, pad)), constant_values=False)
    return ids, c, src


def top_of(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, scores) of the k best per row, best first."""
    k = min(k, scores.shape[1])
    if k == 0:
        return np.zeros((scores.shape[0], 0), dtype=np.int64), np.zeros((scores.shape[0], 0))
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    vals = np.take_along_axis(scores, part, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(vals, order, axis=1)


def calibrated_pair(
    native: np.ndarray,
    bridged: np.ndarray,
    fits: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]],
) -> tuple[np.ndarray, np.ndarray]:
    """Both lists' calibrated scores (nq × n float32) for full score matrices: every item as if
    re-embedded, and every item bridged. A mixed gallery picks per item (``mixed``)."""
    out = (np.empty(native.shape, np.float32), np.empty(bridged.shape, np.float32))
    chunk = max(1, SCORE_BUDGET // 4 // max(native.shape[1], 1))
    for start in range(0, native.shape[0], chunk):
        part = slice(start, start + chunk)
        for scores, fit, dest in ((native, fits[0], out[0]), (bridged, fits[1], out[1])):
            dest[part] = calibrate(scores[part], tuple(a[part] for a in fit))
    return out


def mixed(
    cal_native: np.ndarray, cal_bridged: np.ndarray, reembedded: np.ndarray, rule: str = MERGE_RULE
) -> np.ndarray:
    """The calibrated score of every item in a gallery re-embedded where ``reembedded``: the
    bridged one for the others, and for re-embedded items per ``rule`` (``MERGE_RULES``)."""
    if rule == "native":
        own = cal_native
    elif rule == "max":
        own = np.maximum(cal_native, cal_bridged)
    elif rule == "mean":
        own = (cal_native + cal_bridged) / 2
    else:
        raise ValueError(f"unknown merge rule {rule!r}, expected one of {list(MERGE_RULES)}")
    return np.where(np.asarray(reembedded, dtype=bool)[None, :], own, cal_bridged)


def ranks_of(scores: np.ndarray, relevant: Sequence[np.ndarray]) -> np.ndarray:
    """The 0-based rank of each row's best relevant item (ties count in its favour)."""
    if all(len(rel) == 1 for rel in relevant):
        rows = np.arange(len(relevant))
        best = scores[rows, np.array([rel[0] for rel in relevant], dtype=np.int64)]
        return (scores > best[:, None]).sum(axis=1).astype(np.int64)
    return np.array(
        [int((scores[q] > scores[q, rel].max()).sum()) for q, rel in enumerate(relevant)],
        dtype=np.int64,
    )


def merged_ranks(
    native: np.ndarray,
    bridged: np.ndarray,
    reembedded: np.ndarray,
    relevant: Sequence[np.ndarray],
    fits: tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]],
    rule: str = MERGE_RULE,
) -> np.ndarray:
    """For full score matrices (nq × n: native cosines, bridged scores), a re-embedded mask and
    the two lists' reference tails (``reference_fit``), the merged 0-based rank of each query's
    best relevant item: what a mixed search returns."""
    mask = np.asarray(reembedded, dtype=bool)
    ranks = np.empty(len(relevant), dtype=np.int64)
    chunk = max(1, SCORE_BUDGET // 4 // max(native.shape[1], 1))
    for start in range(0, len(relevant), chunk):
        part = slice(start, start + chunk)
        fit_part = tuple(tuple(a[part] for a in fit) for fit in fits)
        cal = calibrated_pair(native[part], bridged[part], fit_part)  # type: ignore[arg-type]
        ranks[part] = ranks_of(mixed(*cal, mask, rule), relevant[part])
    return ranks


# -- the plan -----------------------------------------------------------------------------------


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
        out = np.empty(len(points), dtype=np.float32)
        w = self.weights.astype(np.float32)
        for start in range(0, len(points), block):
            out[start : start + block] = (
                gain_features(points[start : start + block], self.mean_direction) @ w
            )
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


def item_gains(view: FitView, rule: str = MERGE_RULE) -> tuple[np.ndarray, np.ndarray]:
    """(gain per fit-gallery row, mask of rows the gain is measured for)."""
    n = view.native.shape[1]
    gains = np.zeros(n)
    seen = np.zeros(n, dtype=bool)
    none = np.zeros(n, dtype=bool)
    all_new = np.ones(n, dtype=bool)
    r_native = merged_ranks(view.native, view.bridged, all_new, view.relevant, view.fits, rule)
    r_bridged = merged_ranks(view.native, view.bridged, none, view.relevant, view.fits, rule)
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
) -> list[dict[str, Any]]:
    """Recall@k of the held-out queries with the first ``fraction`` of ``order`` re-embedded."""
    n = view.native.shape[1]
    out = []
    for fraction in fractions:
        mask = np.zeros(n, dtype=bool)
        mask[order[: round(fraction * n)]] = True
        ranks = merged_ranks(view.native, view.bridged, mask, view.relevant, view.fits, rule)
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimator": self.estimator,
            "gain_model": self.gain_model.to_dict(),
            "view": self.view,
            "metric": self.metric,
            "expected": self.expected,
            "validation": self.validation,
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
        )


def fit_planner(
    view: FitView,
    seed: int = 0,
    fractions: Sequence[float] = CURVE_FRACTIONS,
    rule: str = MERGE_RULE,
):
    """Learn the per-item gain on the held-out items, compare estimators by cross-fitting, and
    estimate the curve of the chosen one. Returns a ``PlannerFit``."""
    rng = np.random.default_rng([seed, 12])
    gains, seen = item_gains(view, rule)
    measured = view.held_out[seen[view.held_out]]
    if len(measured) < 4:
        raise ValueError("too few held-out items with queries to learn which items gain most")
    mean_direction = unit_rows(view.old_points.mean(axis=0, keepdims=True))[0].astype(np.float64)
    folds = rng.permutation(measured)
    halves = (np.sort(folds[: len(folds) // 2]), np.sort(folds[len(folds) // 2 :]))
    # Cross-fitted predictions: each half scored by the model fitted on the other half, the rest
    # of the fit gallery by the model fitted on all held-out items.
    full = fit_gain_model(view.old_points[measured], gains[measured], mean_direction)
    predicted = full.predict(view.old_points).astype(np.float64)
    for train, test in ((halves[0], halves[1]), (halves[1], halves[0])):
        part = fit_gain_model(view.old_points[train], gains[train], mean_direction)
        predicted[test] = part.predict(view.old_points[test])
    metric = "recall@10"
    orders = {
        "expected_gain": plan_order(predicted),
        "random": rng.permutation(view.native.shape[1]),
    }
    if view.uncertainty is not None and np.ptp(view.uncertainty) > 1e-6:
        orders["uncertainty"] = plan_order(view.uncertainty)
    curves = {name: curve(view, order, fractions, rule=rule) for name, order in orders.items()}
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
    return PlannerFit(chosen, full, view.view, metric, expected, validation)


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
