"""What a transition verdict expects: the transition search's held-out quality at each
re-embedded share, and the first share at which the gain over staying is measurable. Pure
(an ``EvalSet`` in, a dict out).

The curve is measured, not interpolated: the upgrade's held-out queries (both models' vectors,
their relevant items) search the whole gallery — the upgrade's paired items with a random
``fraction`` of them re-embedded, and the gallery's unpaired items, which have no new features,
in the old space — merged as the service merges a transition search (``app.ml.backfill.mixed``:
reference tails, and the relevance maps when ``CALIBRATION`` is "relevance" — cross-fitted here,
each half of the queries ranked with maps fitted on the other half, so no query grades its own
map; ``app.ml.upgrade.whole_gallery``). The suggested share is the smallest on the curve whose gain over staying (per query,
paired) is above ``SIGNIFICANCE`` standard errors: before it, a user re-embedding at random
would not see a difference their own measurement could tell from noise. 100 % when no smaller
share gets there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.ml.backfill.mixed import CALIBRATION, ranks_of
from app.ml.backfill.plan import CURVE_FRACTIONS
from app.ml.upgrade.alternatives import EvalSet
from app.ml.upgrade.whole_gallery import key_blocks

# Held-out queries the outlook ranks at most (a seeded sample beyond): bounds its time (each
# is scored against every searched item, once per share); memory is bounded by the blocks of
# ``app.ml.upgrade.whole_gallery``.
MAX_QUERIES = 1000
SIGNIFICANCE = 2.0
K = 10


def transition_outlook(ev: EvalSet, seed: int = 0) -> dict[str, Any] | None:
    """The expected transition curve (R@10 per share re-embedded at random), the suggested share
    and the expected R@10 there; None without held-out queries carrying the old model's
    vectors. The searched gallery is the evaluation set's paired items (a random share of them
    re-embedded) and its distractors (the gallery's unpaired items, always in the old space)."""
    if not ev.has_queries or ev.query_old_points is None or ev.query_features is None:
        return None
    assert ev.query_relevant is not None
    keep = [q for q, rel in enumerate(ev.query_relevant) if len(rel)]
    rng = np.random.default_rng([seed, 29])
    if len(keep) > MAX_QUERIES:
        keep = sorted(rng.choice(keep, MAX_QUERIES, replace=False).tolist())
    relevant = [ev.query_relevant[q] for q in keep]
    n = ev.new_features.shape[0]
    order = rng.permutation(n)
    masks = {}
    for fraction in CURVE_FRACTIONS:
        mask = np.zeros(n, dtype=bool)
        mask[order[: round(fraction * n)]] = True
        masks[fraction] = mask
    stay = np.empty(len(relevant), dtype=bool)
    hits = {fraction: np.empty(len(relevant), dtype=bool) for fraction in CURVE_FRACTIONS}
    for block in key_blocks(
        ev.query_features[keep],
        ev.new_features,
        ev.query_old_points[keep],
        ev.searched_old,
        ev.curv,
        relevant,
        seed,
    ):
        rel = [relevant[i] for i in block.rows]
        stay[block.rows] = ranks_of(block.old_scores, rel) < K
        for fraction, mask in masks.items():
            hits[fraction][block.rows] = ranks_of(block.mixed(mask), rel) < K
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
        "searched": {"items": n + ev.n_distractors, "paired": n, "distractors": ev.n_distractors},
        "calibration": CALIBRATION,
        "rule": (
            f"the smallest share re-embedded at random whose held-out recall@{K} gain over "
            f"staying is above {SIGNIFICANCE:g} standard errors (100 % when none is)"
        ),
    }
