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

from app.ml.auto.verdict import REINDEX_BELOW_ARR
from app.ml.backfill.two_stage import (
    Candidates,
    embedded_per_search,
    fusion_scale,
    rerank,
    unit,
)
from app.ml.evaluation.retrieval import query_metrics, top_k
from app.ml.methods.models import EmbeddingModel
from app.ml.upgrade.alternatives import EvalSet

DEPTHS = (10, 25, 50, 100, 200)
# The depth a two-stage search takes by default, and the one a verdict judges: the depth
# ``bench.quality.two_stage`` chose on its validation queries (public lemma → gloss search;
# BENCHMARKS' two-stage section), fixed here before any upgrade's held-out query is seen.
DEFAULT_DEPTH = 200
# Held-out queries ranked at most (a seeded sample beyond), as the transition outlook.
MAX_QUERIES = 1000
# The weights on the old score a served fusion is chosen from (bench.quality.two_stage's grid).
FUSION_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
# The fusion scale's reference sample: this many queries × paired items.
SCALE_QUERIES, SCALE_ITEMS = 300, 1000


def per_query_recall10(ranked: np.ndarray, relevant: list[np.ndarray]) -> np.ndarray:
    """Each query's recall@10 (the share of its relevant items in its first 10)."""
    return np.array(
        [
            np.isin(rel, row[:10]).sum() / max(len(np.unique(rel)), 1)
            for row, rel in zip(ranked, relevant, strict=True)
        ]
    )


def paired(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Mean and standard error of the per-query difference a − b (the same queries)."""
    d = a - b
    se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("nan")
    return {"mean": float(d.mean()), "se": se}


def _curve(
    ev: EvalSet,
    stage_queries: np.ndarray,
    keep: list[int],
    depths: list[int],
    baseline: np.ndarray,
    floors: dict[str, np.ndarray],
) -> dict[str, dict[str, Any]]:
    """The depth curve of one candidate source; ``baseline``: per-query recall@10 of the
    single-stage search the source stands for (stay, or the bridge), for the paired gain;
    ``floors``: per-query recall@10 of what the verdict requires two stages to reach (the
    bridge's search, ``REINDEX_BELOW_ARR`` × the reindex's), each a paired difference too, so
    that the verdict's floors are judged by the same paired rule as its gains (issue 42 item 5)."""
    assert ev.query_features is not None and ev.query_relevant is not None
    ids = top_k(stage_queries, ev.old_points, max(depths), space="lorentz", curv=ev.curv)
    candidates = Candidates(ids, np.zeros(ids.shape, dtype=np.float32))
    relevant = [ev.query_relevant[q] for q in keep]
    out = {}
    for depth in depths:
        ranked, _ = rerank(candidates, ev.query_features[keep], ev.new_features, 10, depth=depth)
        metrics = query_metrics(ranked, relevant)
        mine = per_query_recall10(ranked, relevant)
        out[str(depth)] = {
            "recall@1": metrics["recall@1"],
            "recall@10": metrics["recall@10"],
            "embedded_per_query": embedded_per_search(candidates, depth),
            "gain": paired(mine, baseline),
            **{name: paired(mine, floor) for name, floor in floors.items()},
        }
    return out


def _single_stage(ev: EvalSet, queries: np.ndarray, keep: list[int]) -> np.ndarray:
    assert ev.query_relevant is not None
    ranked = top_k(queries, ev.old_points, 10, space="lorentz", curv=ev.curv)
    return per_query_recall10(ranked, [ev.query_relevant[q] for q in keep])


def _fusion(ev: EvalSet, keep: list[int], depth: int, seed: int) -> dict[str, Any] | None:
    """The weight on the old score a served two-stage search fuses with (candidates by the old
    query vector), chosen on one half of the held-out queries (seeded) by recall@10 at
    ``depth`` (ties: the smaller weight), and reported on the other half beside weight 0; the
    scale from a fixed sample of the first half's queries and the paired items. Cosine of the
    spatial components: the old score of a cosine gallery's lifted points. None with fewer than
    20 queries (no half could choose)."""
    assert ev.query_old_points is not None and ev.query_features is not None
    assert ev.query_relevant is not None
    if len(keep) < 20:
        return None
    rng = np.random.default_rng([seed, 47])
    order = rng.permutation(len(keep))
    half = len(keep) // 2
    fit, report = sorted(order[:half].tolist()), sorted(order[half:].tolist())
    rows = np.asarray(keep)
    sample_q = rng.choice(rows[fit], min(SCALE_QUERIES, len(fit)), replace=False)
    n = ev.old_points.shape[0]
    sample_items = rng.choice(n, min(SCALE_ITEMS, n), replace=False)
    scale = fusion_scale(
        ev.query_old_points[sample_q],
        ev.old_points[sample_items],
        ev.query_features[sample_q],
        ev.new_features[sample_items],
    )

    def recall(part: list[int], weight: float) -> np.ndarray:
        queries = rows[part]
        ids = top_k(
            ev.query_old_points[queries], ev.old_points, depth, space="lorentz", curv=ev.curv
        )
        old = np.einsum("qd,qkd->qk", unit(ev.query_old_points[queries]), unit(ev.old_points)[ids])
        ranked, _ = rerank(
            Candidates(ids, old.astype(np.float32)),
            ev.query_features[queries],
            ev.new_features,
            10,
            weight,
            scale,
        )
        return per_query_recall10(ranked, [ev.query_relevant[q] for q in queries])

    chosen = max(FUSION_WEIGHTS, key=lambda w: (float(recall(fit, w).mean()), -w))
    fused, alone = recall(report, chosen), recall(report, 0.0)
    return {
        "weight": chosen,
        "scale": scale.to_dict(),
        "depth": depth,
        "fit_queries": len(fit),
        "report_queries": len(report),
        "recall@10": float(fused.mean()),
        "recall@10_weight_0": float(alone.mean()),
        "gain_over_weight_0": paired(fused, alone),
    }


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
    out: dict[str, Any] = {
        "queries": len(keep),
        "depths": depths,
        "default_depth": min(DEFAULT_DEPTH, n),
        "weight": 0.0,
        # What each source's paired gain is against: stay's own search, or the bridge's.
        "gain_against": {"old": "stay", "bridge": "bridge"},
    }
    bridged = served.embed(ev.query_features[keep])
    bridge_alone = _single_stage(ev, bridged, keep)
    assert ev.query_relevant is not None
    reindexed = top_k(ev.query_features[keep], ev.new_features, 10, space="cosine")
    reindex = per_query_recall10(reindexed, [ev.query_relevant[q] for q in keep])
    # Two stages − the bridge alone, and − REINDEX_BELOW_ARR × the reindex, per query.
    floors = {"vs_bridge": bridge_alone, "vs_reindex_share": REINDEX_BELOW_ARR * reindex}
    out["reindex_share"] = REINDEX_BELOW_ARR
    if ev.query_old_points is not None:
        stage = ev.query_old_points[keep]
        out["old"] = _curve(ev, stage, keep, depths, _single_stage(ev, stage, keep), floors)
        out["fusion"] = _fusion(ev, keep, out["default_depth"], seed)
    out["bridge"] = _curve(ev, bridged, keep, depths, bridge_alone, floors)
    return out
