"""Does an old embedding's uncertainty predict where search fails? The report's calibration.

With labels (HBCT's question): each held-out item's ``knn`` uncertainty — the share of its k
nearest *training* items in the old space that carry another label — against whether the old
model's own class search fails for it (its nearest other held-out item has another label). The
neighbour sets differ (training items for the uncertainty, held-out items for the failure), so a
correlation is not one by construction.

Without labels: the paper's ``norm`` uncertainty against whether the served bridge misses the
item's own old vector at rank 1. On a cosine gallery every point has one radius, so ``norm`` is
constant and says nothing; the report says so instead of drawing a flat line.

Spearman ρ and a shuffled control (≈ 0 when nothing leaks), and the failure rate in up to
``bins`` equal-count bins of increasing uncertainty — what the report page plots.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from app.ml.evaluation.metrics import uncertainty_calibration
from app.ml.evaluation.retrieval import top_k
from app.ml.geometry.lorentz import uncertainty as norm_uncertainty

DEFAULT_BINS = 10
KNN_K = 10


def binned_failure_rate(
    uncertainty: np.ndarray, failures: np.ndarray, bins: int = DEFAULT_BINS
) -> list[dict[str, float]]:
    """Items sorted by uncertainty, cut into ``bins`` groups of (nearly) equal size: each
    group's mean uncertainty, failure rate and size."""
    order = np.argsort(uncertainty, kind="stable")
    groups = [g for g in np.array_split(order, min(bins, order.size)) if g.size]
    return [
        {
            "uncertainty": float(uncertainty[g].mean()),
            "failure_rate": float(failures[g].mean()),
            "items": int(g.size),
        }
        for g in groups
    ]


def labelled_calibration(
    old_points: np.ndarray,
    labels: np.ndarray,
    eval_rows: np.ndarray,
    train_rows: np.ndarray,
    curv: float,
    k: int = KNN_K,
) -> dict[str, Any]:
    """knn uncertainty (among training items) against old→old class failures (among held-out
    items); ``old_points`` and ``labels`` cover the whole gallery, rows index them."""
    labels = np.asarray(labels)
    depth = min(k, train_rows.size)
    neighbours = train_rows[top_k(old_points[eval_rows], old_points[train_rows], depth, curv=curv)]
    u = (labels[neighbours] != labels[eval_rows][:, None]).mean(axis=1)
    nearest = top_k(old_points[eval_rows], old_points[eval_rows], 1, curv=curv, exclude_self=True)
    failures = (labels[eval_rows][nearest[:, 0]] != labels[eval_rows]).astype(np.float64)
    return {
        "source": "knn",
        "failure": "the old model's nearest other held-out item has another label",
        **uncertainty_calibration(u, failures),
        "bins": binned_failure_rate(u, failures),
    }


def unlabelled_calibration(
    old_points: np.ndarray, eval_rows: np.ndarray, bridged_queries: np.ndarray, curv: float
) -> dict[str, Any]:
    """norm uncertainty of each held-out item's old point against the served bridge missing
    that point at rank 1 (``bridged_queries``: the bridge's outputs for the held-out items)."""
    u = norm_uncertainty(torch.as_tensor(old_points[eval_rows]), curv).numpy().astype(np.float64)
    first = top_k(bridged_queries, old_points, 1, curv=curv)[:, 0]
    failures = (first != eval_rows).astype(np.float64)
    out: dict[str, Any] = {
        "source": "norm",
        "failure": "the served bridge does not return the item's own old vector first",
        **uncertainty_calibration(u, failures),
    }
    if out["constant"]:
        out["note"] = (
            "the norm uncertainty is the same for every item (a gallery at one radius, as cosine "
            "galleries are): it cannot rank items here"
        )
        out["bins"] = []
    else:
        out["bins"] = binned_failure_rate(u, failures)
    return out
