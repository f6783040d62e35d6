"""What ``bench.perf.engines`` measures with: the tiled gallery and its noisy queries (``Data``),
the spread layout's points, and the timers of ingest and search."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from app.ml.geometry.space import EuclideanLift
from app.vectors.lorentz_rows import exact_distances
from app.vectors.milvus.search import SearchHits
from app.vectors.rerank import exact_top_k, recall_within
from bench.common.tiled import lift_points, tiled, wordnet_rows

K = 10
QUERIES = 256
BATCHES = (1, 16, 256)
# Rows per write call: one upload request's worth.
WRITE_ROWS = 2048
# Calls timed per batch size (the median is reported).
CALLS = {1: 20, 16: 8, 256: 3}
# Fraction of the radius where the most generic rows sit (the most specific sit at the radius).
INNER_FRACTION = 0.2


def spread_points(
    features: np.ndarray, radius: float, reference: np.ndarray, curv: float = 1.0
) -> np.ndarray:
    """Space components of ``features`` at radii in [0.2·radius, radius], float32.

    A row's genericity is its cosine to the mean direction of ``reference`` (the gallery's own
    rows): general concepts sit near the centre of an embedding cloud, specific ones at its rim,
    as hierarchy-aware models place them near and far from the origin. The radius is the
    genericity's rank among the reference rows, mapped linearly (most generic → 0.2·radius).
    Point = exp₀(ρ·f/‖f‖): space part sinh(√c·ρ)/√c · f/‖f‖.
    """
    unit = _unit(np.asarray(features, dtype=np.float64))
    reference_unit = _unit(np.asarray(reference, dtype=np.float64))
    centre = reference_unit.mean(axis=0)
    reference_scores = np.sort(reference_unit @ centre)
    rank = np.searchsorted(reference_scores, unit @ centre) / max(len(reference_scores), 1)
    rho = radius * (INNER_FRACTION + (1.0 - INNER_FRACTION) * (1.0 - rank))
    scale = np.sinh(np.sqrt(curv) * rho) / np.sqrt(curv)
    return (scale[:, None] * unit).astype(np.float32)


def _unit(x: np.ndarray) -> np.ndarray:
    # A zero row has no direction; the floor keeps it at the origin instead of NaN.
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def resident_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def queries_per_s(search: Callable[[np.ndarray], object], queries: np.ndarray) -> dict[str, float]:
    out = {}
    for batch in BATCHES:
        search(queries[:batch])
        times = []
        for call in range(CALLS[batch]):
            start = (call * batch) % len(queries)
            part = queries[start : start + batch]
            tic = time.perf_counter()
            search(part)
            times.append(time.perf_counter() - tic)
        out[str(batch)] = batch / float(np.median(times))
    return out


def timed_writes(write: Callable[[slice], object], n: int) -> float:
    tic = time.perf_counter()
    for start in range(0, n, WRITE_ROWS):
        write(slice(start, min(n, start + WRITE_ROWS)))
    return time.perf_counter() - tic


def hits_recall(hits: SearchHits, points: np.ndarray, queries: np.ndarray) -> float:
    _, true_dist = exact_top_k(queries, points, K, 1.0)
    positions = np.array([[int(i) if i else -1 for i in row] for row in hits.item_ids])
    found = exact_distances(queries[:, None, :], points[np.maximum(positions, 0)], 1.0)
    return recall_within(np.where(positions >= 0, found, np.inf), true_dist)


class Data:
    """The tiled gallery (Euclidean rows), its item ids and the noisy queries."""

    def __init__(self, rows: int, seed: int) -> None:
        base = wordnet_rows(with_new=False).old
        self.vectors = tiled(base, rows, seed=seed)
        rng = np.random.default_rng(seed + 1)
        picks = rng.integers(0, rows, QUERIES)
        noisy = self.vectors[picks] + 0.05 * rng.standard_normal((QUERIES, base.shape[1]))
        self.queries = noisy.astype(np.float32)
        self.ids = [str(i) for i in range(rows)]

    def cosine(self, radius: float) -> tuple[np.ndarray, np.ndarray]:
        lift = EuclideanLift(curv=1.0, scale=radius, metric="cosine")
        return lift_points(self.vectors, lift), lift_points(self.queries, lift).astype(np.float64)

    def spread(self, radius: float) -> tuple[np.ndarray, np.ndarray]:
        points = spread_points(self.vectors, radius, self.vectors)
        return points, spread_points(self.queries, radius, self.vectors).astype(np.float64)
