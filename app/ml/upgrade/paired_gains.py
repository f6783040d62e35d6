"""The verdict's evidence: paired per-query differences between the alternatives on held-out data
(issue 42 item 5). Pure (an ``EvalSet`` and the served bridge in, a dict out).

``app.ml.auto.verdict`` compares the alternatives by the objective's primary metric; a point
comparison of two means says nothing about whether a user's own measurement could tell them
apart. Every alternative is measured on the same held-out queries (query view: each logged
query; class view: each evaluated item as a query, itself excluded), so the difference of two
alternatives is a per-query vector whose mean is exactly the difference of their figures in the
report, and whose standard error is the paired one — the rule the two-stage verdict and the
transition outlook already use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.ml.auto.candidates import PRIMARY_METRIC
from app.ml.auto.verdict import REINDEX_BELOW_ARR
from app.ml.evaluation.retrieval import top_k
from app.ml.methods.models import EmbeddingModel
from app.ml.upgrade.alternatives import EvalSet, reindex_ranked
from app.ml.upgrade.two_stage_curve import paired


def _query_recall10(
    ev: EvalSet, queries: np.ndarray, gallery: np.ndarray, space: str, rows: list[int]
) -> np.ndarray:
    """Each query's recall@10 as ``query_metrics`` counts it (relevant found in the first 10
    ÷ distinct relevant items), so that the mean is the report's figure."""
    ranked = top_k(queries, gallery, 10, space=space, curv=ev.curv)  # type: ignore[arg-type]
    return _recall10_of(ev, ranked, rows)


def _recall10_of(ev: EvalSet, ranked: np.ndarray, rows: list[int]) -> np.ndarray:
    """Per query of ``rows``, the share of its relevant items in its ranking's first 10."""
    assert ev.query_relevant is not None
    out = np.empty(len(rows))
    for i, (row, q) in enumerate(zip(ranked, rows, strict=True)):
        rel = np.unique(np.asarray(ev.query_relevant[q], dtype=np.int64))
        out[i] = np.isin(row[:10], rel).sum() / rel.size
    return out


def _class_cmc1(ev: EvalSet, queries: np.ndarray, gallery: np.ndarray, space: str) -> np.ndarray:
    """Each evaluated item's CMC@1 (its nearest other evaluated item shares its label), the
    per-item terms of ``class_metrics``'s CMC@1."""
    assert ev.labels is not None
    labels = ev.labels[ev.rows]
    ranked = top_k(queries, gallery, 1, space=space, curv=ev.curv, exclude_self=True)  # type: ignore[arg-type]
    return (labels[ranked[:, 0]] == labels).astype(np.float64)


def per_query(ev: EvalSet, served: EmbeddingModel, view: str) -> dict[str, np.ndarray] | None:
    """Per held-out query, the view's primary metric (query R@10, class CMC@1) of ``bridge``,
    ``reindex`` and (when measured) ``stay``, on the same queries; None where the view has no
    such figure here (the instance view, or no data for the view). The query view searches what
    the report's figures search (every stored item: ``EvalSet.searched_old``, and the reindex's
    merged ranking, ``reindex_ranked``)."""
    if view == "query" and ev.has_queries and ev.query_features is not None:
        assert ev.query_relevant is not None
        rows = [q for q, rel in enumerate(ev.query_relevant) if len(rel)]
        features = ev.query_features[rows]
        gallery = ev.searched_old
        reindex = reindex_ranked(ev, served)[rows, :10]
        out = {
            "bridge": _query_recall10(ev, served.embed(features), gallery, "lorentz", rows),
            "reindex": _recall10_of(ev, reindex, rows),
        }
        if ev.query_old_points is not None:
            stay = ev.query_old_points[rows]
            out["stay"] = _query_recall10(ev, stay, gallery, "lorentz", rows)
        return out
    if view == "class" and ev.labels is not None and ev.rows.size >= 2:
        old = ev.old_points[ev.rows]
        items = ev.new_features[ev.rows]
        return {
            "bridge": _class_cmc1(ev, served.embed(items), old, "lorentz"),
            "reindex": _class_cmc1(ev, items, items, "cosine"),
            "stay": _class_cmc1(ev, old, old, "lorentz"),
        }
    return None


def paired_gains(ev: EvalSet, served: EmbeddingModel, view: str) -> dict[str, Any] | None:
    """The paired differences the verdict reads on ``view``'s primary metric (``PRIMARY_METRIC``),
    each {mean, se} over the same held-out queries:
    ``bridge_vs_stay`` (bridge − stay), ``reindex_vs_stay`` (reindex − stay; both None without
    stay's figures) and ``bridge_vs_reindex_share`` (bridge − ``REINDEX_BELOW_ARR`` × reindex:
    its mean is ≥ 0 exactly when the bridge's ARR is ≥ ``REINDEX_BELOW_ARR``). None where the
    view has no per-query figure (``per_query``)."""
    values = per_query(ev, served, view)
    if values is None:
        return None
    bridge, reindex, stay = values["bridge"], values["reindex"], values.get("stay")
    return {
        "view": view,
        "metric": PRIMARY_METRIC[view][1],
        "queries": int(bridge.size),
        "bridge_vs_stay": None if stay is None else paired(bridge, stay),
        "reindex_vs_stay": None if stay is None else paired(reindex, stay),
        "bridge_vs_reindex_share": {
            **paired(bridge, REINDEX_BELOW_ARR * reindex),
            "share": REINDEX_BELOW_ARR,
        },
    }
