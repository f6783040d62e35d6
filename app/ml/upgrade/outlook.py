"""What a transition verdict expects: the transition search's held-out quality at each
re-embedded share, and the first share at which the gain over staying is measurable. Pure
(an ``EvalSet`` in, a dict out).

The curve is measured, not interpolated: the upgrade's held-out queries (both models' vectors,
their relevant items) search the upgrade's paired items with a random ``fraction`` of them
re-embedded, merged as the service merges a transition search (``app.ml.backfill.mixed``:
reference tails, and the relevance maps when ``CALIBRATION`` is "relevance" — cross-fitted here,
each half of the queries ranked with maps fitted on the other half, so no query grades its own
map). The suggested share is the smallest on the curve whose gain over staying (per query,
paired) is above ``SIGNIFICANCE`` standard errors: before it, a user re-embedding at random
would not see a difference their own measurement could tell from noise. 100 % when no smaller
share gets there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.ml.backfill.mixed import (
    CALIBRATION,
    COSINE_END,
    NO_MAPS,
    calibrated_pair,
    calibrated_scores,
    cosine_scores,
    lorentz_end,
    lorentz_scores,
    mixed,
    pick_reference,
    ranks_of,
    reference_fit,
)
from app.ml.backfill.plan import CURVE_FRACTIONS
from app.ml.backfill.relevance import fit_relevance
from app.ml.upgrade.alternatives import EvalSet

# Held-out queries the outlook ranks at most (a seeded sample beyond): bounds its memory
# (queries × paired items, float64 keys, twice).
MAX_QUERIES = 1000
SIGNIFICANCE = 2.0
K = 10


def transition_outlook(ev: EvalSet, seed: int = 0) -> dict[str, Any] | None:
    """The expected transition curve (R@10 per share re-embedded at random), the suggested share
    and the expected R@10 there; None without held-out queries carrying the old model's
    vectors."""
    if not ev.has_queries or ev.query_old_points is None or ev.query_features is None:
        return None
    assert ev.query_relevant is not None
    keep = [q for q, rel in enumerate(ev.query_relevant) if len(rel)]
    rng = np.random.default_rng([seed, 29])
    if len(keep) > MAX_QUERIES:
        keep = sorted(rng.choice(keep, MAX_QUERIES, replace=False).tolist())
    relevant = [ev.query_relevant[q] for q in keep]
    features = ev.query_features[keep]
    old_queries = ev.query_old_points[keep]
    n = ev.new_features.shape[0]
    reference = pick_reference(n, seed)
    native = cosine_scores(features, ev.new_features)
    old = lorentz_scores(old_queries, ev.old_points, ev.curv)
    fits = (
        reference_fit(cosine_scores(features, ev.new_features[reference]), end=COSINE_END),
        reference_fit(
            lorentz_scores(old_queries, ev.old_points[reference], ev.curv),
            end=lorentz_end(ev.curv),
        ),
    )
    order = rng.permutation(n)
    stay = ranks_of(old, relevant) < K
    parts = _merge_keys(native, old, fits, relevant, rng)
    hits: dict[float, np.ndarray] = {}
    for fraction in CURVE_FRACTIONS:
        mask = np.zeros(n, dtype=bool)
        mask[order[: round(fraction * n)]] = True
        ranks = np.empty(len(relevant), dtype=np.int64)
        for rows, keys in parts:
            ranks[rows] = ranks_of(mixed(*keys, mask), [relevant[i] for i in rows])
        hits[fraction] = ranks < K
    curve = [
        {"fraction": f, "metric": f"recall@{K}", "value": float(h.mean())} for f, h in hits.items()
    ]
    suggested = 1.0
    for fraction, h in hits.items():
        if not 0 < fraction < 1:
            continue
        gain = h.astype(float) - stay.astype(float)
        error = gain.std(ddof=1) / np.sqrt(len(gain)) if len(gain) > 1 else np.inf
        if gain.mean() > SIGNIFICANCE * error and error > 0:
            suggested = fraction
            break
    return {
        "expected": curve,
        "suggested_fraction": suggested,
        "expected_at_suggested": float(hits[suggested].mean()),
        "queries": len(keep),
        "items": n,
        "calibration": CALIBRATION,
        "rule": (
            f"the smallest share re-embedded at random whose held-out recall@{K} gain over "
            f"staying is above {SIGNIFICANCE:g} standard errors (100 % when none is)"
        ),
    }


def _merge_keys(native, old, fits, relevant, rng) -> list[tuple[np.ndarray, tuple]]:
    """(query rows, both lists' merge keys for them): every query at once on the tails alone,
    or with relevance maps two halves, each keyed by maps fitted on the other (cross-fitting)."""
    if CALIBRATION != "relevance" or len(relevant) < 2:
        return [(np.arange(len(relevant)), calibrated_pair(native, old, fits, NO_MAPS))]
    halves = np.array_split(rng.permutation(len(relevant)), 2)
    out = []
    for rows, other in ((halves[0], halves[1]), (halves[1], halves[0])):
        maps = tuple(
            fit_relevance(
                calibrated_scores(scores[other], tuple(a[other] for a in fit)),
                [relevant[i] for i in other],
            )
            for scores, fit in ((native, fits[0]), (old, fits[1]))
        )
        row_fits = tuple(tuple(a[rows] for a in fit) for fit in fits)
        out.append((rows, calibrated_pair(native[rows], old[rows], row_fits, maps)))  # type: ignore[arg-type]
    return out
