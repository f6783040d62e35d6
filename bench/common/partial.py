"""The upgrade a partial-backfill benchmark starts from: trained on the training synsets' glosses
with a query log of their lemmas (both models, each relevant to its own gloss), and the service's
view of its held-out part (``app.ml.upgrade.fit_view``), as POST /v1/upgrades and the first plan
or mixed search would build them."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.ml.backfill.plan import FitView
from app.ml.geometry.space import EuclideanLift
from app.ml.upgrade.data import UpgradeOutcome
from app.ml.upgrade.fit_view import build_fit_view
from app.ml.upgrade.run import (
    QueryLog,
    UpgradeData,
    run_backbone_upgrade,
    split_for_evaluation,
    split_queries,
)
from app.upgrades.schemas import UpgradeCreate

# The service's default held-out share of an upgrade (the planner's and the maps' data).
UPGRADE_EVAL_FRACTION = UpgradeCreate.model_fields["eval_fraction"].default


def upgrade_on(
    arrays: dict[str, np.ndarray],
    train: np.ndarray,
    method: str,
    seed: int,
    params: dict[str, Any] | None = None,
) -> tuple[UpgradeOutcome, EuclideanLift, FitView]:
    """Train ``method`` on the ``train`` synsets; (outcome, the gallery's lift, the fit view)."""
    log = QueryLog(
        features=arrays["query_new"][train],
        old_vectors=arrays["query_old"][train],
        relevant=[np.array([i]) for i in range(len(train))],
    )
    data = UpgradeData(arrays["doc_new"][train], arrays["doc_old"][train], None, log)
    lift = EuclideanLift()
    outcome = run_backbone_upgrade(
        method, data, lift, params=params, seed=seed, eval_fraction=UPGRADE_EVAL_FRACTION
    )
    _, eval_idx = split_for_evaluation(len(data), UPGRADE_EVAL_FRACTION, seed)
    _, eval_q = split_queries(data.queries, eval_idx, UPGRADE_EVAL_FRACTION, seed)
    view = build_fit_view(outcome.model, data, lift, eval_idx, eval_q, seed)
    return outcome, lift, view
