"""Vector engines side by side: Milvus (through app.search.milvus_engine) and FAISS.

Galleries at several radii (``spread_points``): real WordNet-noun MiniLM rows, each lifted to a
radius that grows with how specific the row is.
"""

from __future__ import annotations

import numpy as np

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
    centre = _unit(np.asarray(reference, dtype=np.float64)).mean(axis=0)
    reference_scores = np.sort(_unit(np.asarray(reference, dtype=np.float64)) @ centre)
    scores = unit @ centre
    rank = np.searchsorted(reference_scores, scores) / max(len(reference_scores), 1)
    rho = radius * (INNER_FRACTION + (1.0 - INNER_FRACTION) * (1.0 - rank))
    scale = np.sinh(np.sqrt(curv) * rho) / np.sqrt(curv)
    return (scale[:, None] * unit).astype(np.float32)


def _unit(x: np.ndarray) -> np.ndarray:
    # A zero row has no direction; the floor keeps it at the origin instead of NaN.
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
