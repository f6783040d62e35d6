"""What two-stage search would give on the upgrade's held-out queries (issue 43, item 8): the
depth curve. Pure (an ``EvalSet`` and the served model in, a dict out).

Stage one takes each held-out query's ``depth`` nearest paired items in the old gallery by the
service's own order (Lorentz distance of the lifted points): by the old model's query vector
(``old``) when the log carries it, and by the served bridge's query (``bridge``: the old model
gone). Stage two ranks those candidates by the new backbone's cosine (weight 0: the new model
alone), the dataset's new features standing in for the embedder — no embedder call is needed to
measure it. Every depth is reported; none is chosen here, so nothing is selected on these
held-out queries.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.ml.backfill.two_stage import Candidates, embedded_per_search, rerank
from app.ml.evaluation.retrieval import query_metrics, top_k
from app.ml.methods.models import EmbeddingModel
from app.ml.upgrade.alternatives import EvalSet

DEPTHS = (10, 25, 50, 100, 200)
# Held-out queries ranked at most (a seeded sample beyond), as the transition outlook.
MAX_QUERIES = 1000


def _curve(
    ev: EvalSet, stage_queries: np.ndarray, keep: list[int], depths: list[int]
) -> dict[str, dict[str, float]]:
    assert ev.query_features is not None and ev.query_relevant is not None
    ids = top_k(stage_queries, ev.old_points, max(depths), space="lorentz", curv=ev.curv)
    candidates = Candidates(ids, np.zeros(ids.shape, dtype=np.float32))
    relevant = [ev.query_relevant[q] for q in keep]
    out = {}
    for depth in depths:
        ranked, _ = rerank(candidates, ev.query_features[keep], ev.new_features, 10, depth=depth)
        metrics = query_metrics(ranked, relevant)
        out[str(depth)] = {
            "recall@1": metrics["recall@1"],
            "recall@10": metrics["recall@10"],
            "embedded_per_query": embedded_per_search(candidates, depth),
        }
    return out


def two_stage_curve(ev: EvalSet, served: EmbeddingModel, seed: int = 0) -> dict[str, Any] | None:
    """R@1, R@10 and documents embedded per query at each depth, for candidates by the old
    query vector and by the bridged query; None without held-out queries."""
    if not ev.has_queries or ev.query_features is None:
        return None
    assert ev.query_relevant is not None
    keep = [q for q, rel in enumerate(ev.query_relevant) if len(rel)]
    if len(keep) > MAX_QUERIES:
        rng = np.random.default_rng([seed, 43])
        keep = sorted(rng.choice(keep, MAX_QUERIES, replace=False).tolist())
    n = ev.old_points.shape[0]
    depths = sorted({min(d, n) for d in DEPTHS})
    out: dict[str, Any] = {"queries": len(keep), "depths": depths, "weight": 0.0}
    if ev.query_old_points is not None:
        out["old"] = _curve(ev, ev.query_old_points[keep], keep, depths)
    out["bridge"] = _curve(ev, served.embed(ev.query_features[keep]), keep, depths)
    return out
