"""Retrieval quality as users meet it: instance, query→document and class views (float64).

Every function is pure. Rankings are computed in float64 in chunks of queries, so a 24,000 ×
24,000 search never holds more than ``chunk`` × gallery scores at once.

- **Instance view**: each query is an item's own new-backbone features (embedded by the model
  under test); the gallery is every paired item; the one relevant result is the item itself.
  Own-item R@1, R@10 and MRR@100.
- **Query→document view**: logged queries against the gallery — in an upgrade's report every
  stored item, the unpaired ones in the old space (``app.ml.upgrade.whole_gallery``) —,
  relevant = the items the query log names. R@1, R@10 (the share of a query's relevant items in
  its top k), MRR@100 and nDCG@10 (binary gains).
- **Class view**: the evaluation set is query and gallery, each query's own item excluded,
  relevant = same label. CMC@1 and mAP@100; mAP's average precision is divided by
  min(relevant items in the gallery, 100) (``map_normalisation="relevant"``, the usual one) or by
  the relevant items found in the top 100 (``"found"``, what ``app.ml.evaluation.metrics`` reports and the
  older figures use).

Spaces: ``"lorentz"`` ranks space components of points in one Lorentz frame by the Lorentz inner
product (the order of increasing geodesic distance); ``"cosine"`` ranks raw backbone features by
cosine similarity (how a new backbone is used natively).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from app.ml.geometry.lorentz import pairwise_lorentz_inner

Space = Literal["lorentz", "cosine"]
RANK_DEPTH = 100
INSTANCE_METRICS = ("recall@1", "recall@10", "mrr@100")
QUERY_METRICS = ("recall@1", "recall@10", "mrr@100", "ndcg@10")
CLASS_METRICS = ("cmc1", "map@100")
VIEW_METRICS: dict[str, tuple[str, ...]] = {
    "instance": INSTANCE_METRICS,
    "query": QUERY_METRICS,
    "class": CLASS_METRICS,
}

METRIC_MEANINGS: dict[str, dict[str, str]] = {
    "instance": {
        "recall@1": "Share of held-out items whose own stored vector comes first when the item's "
        "new features search the paired items (every other paired item a distractor; the "
        "gallery's items without new features are not searched in this view, see `searched`).",
        "recall@10": "Share of held-out items whose own stored vector is among the first 10.",
        "mrr@100": "Mean of 1/rank of the item's own stored vector (0 when it is not in the first "
        "100): 1 means always first, 0.5 typically second.",
    },
    "query": {
        "recall@1": "Share of a held-out logged query's relevant items found at rank 1 when it "
        "searches every stored item of the gallery, averaged over queries (with one relevant "
        "item: the share of queries answered right first); `searched` says how each "
        "alternative scored the items without new features.",
        "recall@10": "Share of a query's relevant items found in its first 10 results, averaged "
        "over queries.",
        "mrr@100": "Mean of 1/rank of the first relevant result (0 when none is in the first 100).",
        "ndcg@10": "Discounted cumulative gain of the first 10 results (relevant = 1, earlier "
        "counts more) divided by the best possible; 1 means every relevant item at the top.",
    },
    "class": {
        "cmc1": "Share of held-out items whose nearest other held-out item has the same label.",
        "map@100": "Mean average precision over the first 100 results, relevant = same label, "
        "divided by min(relevant items in the gallery, 100).",
    },
    "arr": {
        "arr": "Bridged ÷ reindex for the same metric: how much of the new model's native quality "
        "(re-embedding the whole gallery) a search of the old gallery keeps; 1 keeps all of it.",
    },
    "p_com": {
        "p_com": "Class view: (M(bridged→old) − M(old→old)) ÷ (M(reference) − M(old→old)), the "
        "share of the gap between the old model and the stronger new reference (raw new backbone "
        "by cosine, or a new head trained without compatibility) that the bridge closes; > 0 "
        "means it beats the old model; null where the reference is not above the old model "
        "(no gap to close).",
    },
    "p_up": {
        "p_up": "Class view: (M(bridged model's own space) − M(reference)) ÷ M(reference): what "
        "compatibility costs the new model when it also searches its own space; 0 costs nothing.",
    },
}


def _as64(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float64)


def top_k(
    queries: np.ndarray,
    gallery: np.ndarray,
    k: int,
    *,
    space: Space = "lorentz",
    curv: float = 1.0,
    exclude_self: bool = False,
    chunk: int = 512,
) -> np.ndarray:
    """Indices of each query's ``k`` best gallery items, best first (Q × min(k, gallery)).

    ``exclude_self``: the gallery is the query set itself and row i never returns item i.
    Among equal scores the lower gallery index comes first.
    """
    if space not in ("lorentz", "cosine"):
        raise ValueError(f"unknown space {space!r}")
    q, g = _as64(queries), _as64(gallery)
    if q.ndim != 2 or g.ndim != 2 or q.shape[1] != g.shape[1]:
        raise ValueError("queries and gallery must be 2-d with the same width")
    if exclude_self and q.shape[0] != g.shape[0]:
        raise ValueError("exclude_self needs the query set as the gallery")
    if space == "cosine":
        q = q / torch.clamp(torch.linalg.norm(q, dim=1, keepdim=True), min=1e-300)
        g = g / torch.clamp(torch.linalg.norm(g, dim=1, keepdim=True), min=1e-300)
    available = g.shape[0] - (1 if exclude_self else 0)
    depth = max(0, min(k, available))
    out = np.empty((q.shape[0], depth), dtype=np.int64)
    if depth == 0:
        return out
    for start in range(0, q.shape[0], chunk):
        block = q[start : start + chunk]
        score = block @ g.T if space == "cosine" else pairwise_lorentz_inner(block, g, curv)
        if exclude_self:
            rows = torch.arange(score.shape[0])
            score[rows, rows + start] = -math.inf
        # Stable order on ties: sort the k+margin best by (−score, index).
        top = torch.topk(score, min(depth, score.shape[1]), dim=1, sorted=True)
        vals, idx = top.values, top.indices
        key = torch.argsort(idx, dim=1, stable=True)
        vals, idx = torch.gather(vals, 1, key), torch.gather(idx, 1, key)
        order = torch.argsort(-vals, dim=1, stable=True)
        out[start : start + chunk] = torch.gather(idx, 1, order).numpy()
    return out


def _first_hit_rank(hits: np.ndarray) -> np.ndarray:
    """1-based rank of the first True per row, 0 where none."""
    any_hit = hits.any(axis=1)
    return np.where(any_hit, hits.argmax(axis=1) + 1, 0)


def instance_metrics(ranked: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    """Own-item R@1, R@10 and MRR@100 from best-first rankings and each query's one target."""
    targets = np.asarray(targets, dtype=np.int64)
    if ranked.shape[0] != targets.shape[0]:
        raise ValueError("one target per ranked query")
    if ranked.shape[0] == 0:
        return {m: math.nan for m in INSTANCE_METRICS}
    hits = ranked[:, :RANK_DEPTH] == targets[:, None]
    rank = _first_hit_rank(hits)
    return {
        "recall@1": float(np.mean((rank >= 1) & (rank <= 1))),
        "recall@10": float(np.mean((rank >= 1) & (rank <= 10))),
        "mrr@100": float(np.mean(np.where(rank > 0, 1.0 / np.maximum(rank, 1), 0.0))),
    }


_DISCOUNT = 1.0 / np.log2(np.arange(2, 12))  # ranks 1..10


def query_metrics(ranked: np.ndarray, relevant: Sequence[np.ndarray]) -> dict[str, float]:
    """R@1, R@10, MRR@100 and nDCG@10 from best-first rankings and each query's relevant items.

    Queries without relevant items are skipped (they measure nothing); R@k divides the relevant
    items found in the top k by all of the query's relevant items.
    """
    if ranked.shape[0] != len(relevant):
        raise ValueError("one relevant list per ranked query")
    rows = [i for i, r in enumerate(relevant) if len(r) > 0]
    if not rows:
        return {m: math.nan for m in QUERY_METRICS}
    r1, r10, rr, ndcg = [], [], [], []
    for i in rows:
        rel = np.unique(np.asarray(relevant[i], dtype=np.int64))
        hits = np.isin(ranked[i, :RANK_DEPTH], rel)
        r1.append(hits[:1].sum() / rel.size)
        r10.append(hits[:10].sum() / rel.size)
        first = int(hits.argmax()) + 1 if hits.any() else 0
        rr.append(1.0 / first if first else 0.0)
        top = hits[:10].astype(np.float64)
        dcg = float((top * _DISCOUNT[: top.size]).sum())
        ideal = float(_DISCOUNT[: min(rel.size, 10)].sum())
        ndcg.append(dcg / ideal)
    return {
        "recall@1": float(np.mean(r1)),
        "recall@10": float(np.mean(r10)),
        "mrr@100": float(np.mean(rr)),
        "ndcg@10": float(np.mean(ndcg)),
    }


def class_metrics(
    queries: np.ndarray,
    gallery: np.ndarray,
    labels: np.ndarray,
    *,
    space: Space = "lorentz",
    curv: float = 1.0,
    map_normalisation: Literal["relevant", "found"] = "relevant",
    depth: int = RANK_DEPTH,
) -> dict[str, float]:
    """CMC@1 and mAP@``depth`` with row i of ``queries`` and of ``gallery`` the same item (the
    evaluation set as query and gallery; the query's own item excluded)."""
    labels = np.asarray(labels)
    if labels.shape[0] != np.asarray(queries).shape[0]:
        raise ValueError("one label per item")
    if labels.shape[0] < 2:
        return {m: math.nan for m in CLASS_METRICS}
    ranked = top_k(queries, gallery, depth, space=space, curv=curv, exclude_self=True)
    relevant = labels[ranked] == labels[:, None]
    hits = np.cumsum(relevant, axis=1)
    precision_sum = (hits / np.arange(1, relevant.shape[1] + 1) * relevant).sum(axis=1)
    if map_normalisation == "relevant":
        _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
        denominator = np.minimum(counts[inverse] - 1, depth)
    elif map_normalisation == "found":
        denominator = relevant.sum(axis=1)
    else:
        raise ValueError("map_normalisation must be 'relevant' or 'found'")
    ap = np.divide(
        precision_sum,
        denominator,
        out=np.zeros_like(precision_sum),
        where=denominator > 0,
    )
    return {"cmc1": float(relevant[:, 0].mean()), "map@100": float(ap.mean())}


def ratio(numerator: float | None, denominator: float | None) -> float:
    """numerator / denominator, NaN where either is missing or the denominator is 0."""
    if numerator is None or denominator is None or not denominator or math.isnan(denominator):
        return math.nan
    return numerator / denominator


def arr(bridged: Mapping[str, float], reindex: Mapping[str, float]) -> dict[str, float]:
    """ARR per metric: bridged / reindex."""
    return {m: ratio(bridged[m], reindex.get(m)) for m in bridged}


def compatibility(
    new_old: Mapping[str, float],
    new_new: Mapping[str, float],
    old_old: Mapping[str, float],
    references: Mapping[str, Mapping[str, float]],
) -> dict[str, Any]:
    """P_com and P_up per metric against the stronger reference for that metric.

    ``references`` maps a reference's name (e.g. ``raw_new``, ``independent``) to its class
    metrics in its own space; for each metric the best of them is M(reference). P_com is NaN
    (null in a report) where M(reference) ≤ M(old→old): there is no gap to close, and a
    negative denominator would invert the share (a collapsed map would read as a large gain).
    """
    out: dict[str, Any] = {"p_com": {}, "p_up": {}, "reference": {}}
    for m in new_old:
        name, best = max(
            ((n, r[m]) for n, r in references.items() if not math.isnan(r[m])),
            key=lambda item: item[1],
            default=(None, math.nan),
        )
        out["reference"][m] = name
        gap = best - old_old[m]
        out["p_com"][m] = ratio(new_old[m] - old_old[m], gap) if gap > 0 else math.nan
        out["p_up"][m] = ratio(new_new[m] - best, best)
    return out


def json_safe(value: Any) -> Any:
    """Reports are JSON: NaN and ±inf become None, numpy scalars plain Python numbers."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return [json_safe(v) for v in value.tolist()]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else None
    return value
