"""Class-conditional maps (issue 26 item 5): the Procrustes map plus experts gated by class group.

Backward-compatible training with frozen old features often maps new features to the old space
with one transformation for every item; a class-conditional map lets the correction depend on
where an item's class lies. Here the classes are grouped by spherical k-means of their mean new
features; each group gets a low-rank expert, and a soft gate on the cosine to each group's
centroid mixes them (``heads.ClassConditionalHead``). Without labels the groups are clusters of
the features themselves. Pure functions, no I/O.
"""

from __future__ import annotations

import torch
from torch import Tensor

from app.ml.geometry.lorentz import log_map0
from app.ml.methods.heads import ClassConditionalHead, orthogonal_procrustes

KMEANS_ITERATIONS = 25
# Rows clustered when there are no labels: k-means on a seeded sample, enough for 1024 centroids.
MAX_CLUSTERED_ROWS = 20_000


def spherical_kmeans(
    vectors: Tensor, k: int, seed: int, iterations: int = KMEANS_ITERATIONS
) -> Tensor:
    """k unit centroids maximising Σ_i max_j cos(x_i, c_j) (Lloyd's iterations on the sphere).

    Starts at k distinct rows drawn with ``seed``; a centroid left without rows keeps its place.
    ``k`` is clamped to the number of rows. Returns k×D, rows of norm 1.
    """
    x = torch.nn.functional.normalize(vectors.double(), dim=-1)
    k = max(1, min(int(k), x.shape[0]))
    generator = torch.Generator().manual_seed(int(seed))
    centroids = x[torch.randperm(x.shape[0], generator=generator)[:k]].clone()
    for _ in range(iterations):
        assign = (x @ centroids.T).argmax(dim=1)
        sums = torch.zeros_like(centroids).index_add_(0, assign, x)
        filled = torch.bincount(assign, minlength=k) > 0
        centroids[filled] = torch.nn.functional.normalize(sums[filled], dim=-1)
    return centroids.to(vectors.dtype)


def group_centroids(features: Tensor, labels: Tensor | None, experts: int, seed: int) -> Tensor:
    """Where the gate's centroids start: k-means of the class means of ``features`` (labels),
    else of a seeded sample of the features."""
    if labels is not None:
        n_classes = int(labels.max().item()) + 1
        sums = torch.zeros(n_classes, features.shape[1], dtype=features.dtype)
        sums.index_add_(0, labels, features)
        present = torch.bincount(labels, minlength=n_classes) > 0
        points = sums[present]
    else:
        generator = torch.Generator().manual_seed(int(seed))
        order = torch.randperm(features.shape[0], generator=generator)[:MAX_CLUSTERED_ROWS]
        points = features[order]
    return spherical_kmeans(points, experts, seed)


def fit_class_conditional_map(
    new_features: Tensor,
    old_points: Tensor,
    labels: Tensor | None,
    curv: float,
    experts: int,
    rank: int,
    seed: int,
) -> ClassConditionalHead:
    """A ``ClassConditionalHead`` at its start: P and the scale from orthogonal Procrustes (new
    features → old tangents, as ``procrustes``), centroids at ``group_centroids``, corrections 0;
    so before training it embeds exactly as the Procrustes map does."""
    old_tangent = log_map0(old_points, curv)
    projection, scale = orthogonal_procrustes(new_features, old_tangent)
    centroids = group_centroids(new_features, labels, experts, seed)
    torch.manual_seed(seed)
    head = ClassConditionalHead(
        new_features.shape[1],
        old_points.shape[1],
        experts=centroids.shape[0],
        rank=rank,
        curv=curv,
        init_scale=max(scale, 1e-6),
    )
    with torch.no_grad():
        head.projection.copy_(projection)
        head.centroids.copy_(centroids)
    return head
