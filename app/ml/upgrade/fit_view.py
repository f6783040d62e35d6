"""The planner's view of an upgrade's held-out data: held-out queries scored natively (new
backbone, cosine) and bridged (the model's query against the old points) over the whole gallery
— the upgrade's paired items, and the gallery's unpaired items (``UpgradeData.distractors``),
which have no new features and stay in the old space at every share re-embedded. Pure (arrays
and a model in, a ``FitView`` out)."""

from __future__ import annotations

import numpy as np
import torch

from app.ml.backfill.mixed import (
    COSINE_END,
    cosine_scores,
    lorentz_end,
    lorentz_scores,
    pick_reference,
    reference_fit,
)
from app.ml.backfill.plan import MAX_FIT_ITEMS, MAX_FIT_QUERIES, FitView
from app.ml.geometry.lorentz import uncertainty as norm_uncertainty
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.models import EmbeddingModel
from app.ml.upgrade.data import UpgradeData


def native_reference_fit(
    features: np.ndarray, reference_new: np.ndarray, *, unit_reference: bool = False
):
    """The native list's tail per query: cosines of the new backbone's query features over the
    reference documents' new features (``unit_reference``: those are unit rows already)."""
    scores = cosine_scores(features, reference_new, unit_items=unit_reference)
    return reference_fit(scores, end=COSINE_END)


def bridged_reference_fit(
    query_points: np.ndarray,
    reference_points: np.ndarray,
    curv: float,
    reference_time: np.ndarray | None = None,
):
    """The bridged list's tail per query: the bridged query's Lorentz scores over the reference
    documents' old points (gallery frame; ``reference_time``: their ``lorentz_time``, if kept)."""
    return reference_fit(
        lorentz_scores(query_points, reference_points, curv, reference_time),
        end=lorentz_end(curv),
    )


def build_fit_view(
    model: EmbeddingModel,
    data: UpgradeData,
    lift: EuclideanLift,
    eval_idx: np.ndarray,
    eval_queries: np.ndarray,
    seed: int = 0,
) -> FitView:
    """The held-out part of an upgrade (``eval_idx`` items, ``eval_queries`` query indices, as
    ``split_for_evaluation``/``split_queries`` gave them) as the planner sees it. Query view when
    held-out queries carry relevance, else the instance view (each held-out item's own new
    features as the query, the item itself relevant).

    Columns: the paired items kept (``rows``), then the gallery's unpaired items (old points
    only: their native columns are −inf, ``FitView.reembeddable`` marks where they start), at
    most ``MAX_FIT_ITEMS`` columns in all — a seeded sample of the unpaired items beyond, which
    ``searched`` says."""
    rng = np.random.default_rng([seed, 121])
    n = len(data)
    rows = np.arange(n)
    if n > MAX_FIT_ITEMS:
        keep_rest = rng.choice(np.setdiff1d(rows, eval_idx), MAX_FIT_ITEMS - len(eval_idx), False)
        rows = np.sort(np.concatenate([eval_idx, keep_rest]))
    distractors = np.zeros((0, data.old_vectors.shape[1]), dtype=np.float32)
    if data.n_distractors:
        assert data.distractors is not None
        distractors = data.distractors
        room = max(0, MAX_FIT_ITEMS - len(rows))
        if len(distractors) > room:
            # A separate stream: the paired sample above and the query sample below stay as
            # they were without distractors.
            pick = np.random.default_rng([seed, 122]).choice(len(distractors), room, False)
            distractors = distractors[np.sort(pick)]
    position = np.full(n, -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    log = data.queries
    relevant: list[np.ndarray] = []
    query_features: list[int] = []
    if log is not None and log.relevant is not None:
        for q in np.asarray(eval_queries, dtype=np.int64):
            rel = position[log.relevant[q]] if log.relevant[q].size else np.zeros(0, np.int64)
            rel = rel[rel >= 0]
            if rel.size:
                query_features.append(int(q))
                relevant.append(rel)
    old_queries = None
    if relevant:
        view = "query"
        features = log.features[np.asarray(query_features)]
        if log.old_vectors is not None:
            old_queries = log.old_vectors[np.asarray(query_features)]
    else:
        view = "instance"
        features = data.new_features[eval_idx]
        relevant = [np.array([position[i]]) for i in eval_idx]
    if len(relevant) > MAX_FIT_QUERIES:
        pick = np.sort(rng.choice(len(relevant), MAX_FIT_QUERIES, replace=False))
        features = features[pick]
        relevant = [relevant[i] for i in pick]
        if old_queries is not None:
            old_queries = old_queries[pick]
    old_vectors = np.concatenate([data.old_vectors[rows], distractors])
    old_points = lift(torch.as_tensor(old_vectors, dtype=torch.float64)).numpy()
    query_points = model.embed(features)
    curv = float(model.curv)
    native = cosine_scores(features, data.new_features[rows])
    if len(distractors):
        # No new features: never scored natively (−inf keys, never re-embedded by a curve).
        pad = np.full((len(native), len(distractors)), -np.inf, dtype=native.dtype)
        native = np.concatenate([native, pad], axis=1)
    bridged = lorentz_scores(query_points, old_points, curv)
    reference = pick_reference(len(rows), seed)
    old = old_fit = None
    if old_queries is not None:
        old_query_points = lift(torch.as_tensor(old_queries, dtype=torch.float64)).numpy()
        old = lorentz_scores(old_query_points, old_points, curv)
        old_fit = bridged_reference_fit(old_query_points, old_points[reference], curv)
    return FitView(
        native=native,
        bridged=bridged,
        fits=(
            native_reference_fit(features, data.new_features[rows][reference]),
            bridged_reference_fit(query_points, old_points[reference], curv),
        ),
        relevant=relevant,
        old_points=old_points.astype(np.float32),
        held_out=np.sort(position[eval_idx]),
        view=view,
        uncertainty=norm_uncertainty(torch.as_tensor(old_points), curv).numpy(),
        old=old,
        old_fit=old_fit,
        reembeddable=len(rows),
        searched={
            "items": len(rows) + len(distractors),
            "paired": len(rows),
            "paired_total": n,
            "distractors": len(distractors),
            "unpaired_total": data.n_unpaired,
            "sampled": len(rows) < n or len(distractors) < data.n_unpaired,
            "note": "held-out queries against the paired items (a share of them re-embedded; "
            "the curves' fraction is that share) and the gallery's unpaired items, which have "
            "no new features and stay in the old space at every share",
        },
    )
