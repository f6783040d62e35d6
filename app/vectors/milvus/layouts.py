"""What a vector engine indexes for a Lorentz gallery (``GalleryLayout``: one gallery's); the
exact float64 re-rank after it is the core's (``app.vectors.rerank``).

Pure and I/O-free (numpy and ``app.ml.geometry.lorentz``): the Milvus engine, its search and the
engine benchmark use it. Three layouts, chosen per gallery from measured facts (issue 14,
``bench.perf.engines``):

* ``cosine`` — every point at one radius r (cosine-lifted external galleries). Then
  ⟨q,x⟩_L = q·x − q₀x₀ with x₀ and ‖x‖ the same for every x, so the Lorentz ranking is the
  cosine ranking of the space components: an ordinary COSINE index over x ranks exactly.
* ``tangent`` — points at many radii. An engine's HNSW or IVF builds its graph or clusters from
  gallery-to-gallery scores; over lifted vectors those inner products are not hyperbolic and
  recall@10 fell to 0.02–0.19. The tangent vector v = log₀(x) keeps the direction of x and has
  norm d(o,x), so L2 neighbours in the tangent space are a good candidate list: an L2 HNSW over
  v proposes k′ candidates and the float64 Lorentz distance re-ranks them. Kept for collections
  made before ``poincare``: it weights angles by r where the hyperbolic metric does by sinh r, so
  at radius 6 the exact top-10 needed k′ ≈ 200–300 L2 candidates.
* ``poincare`` — points at many radii, the layout new ones get. The Poincaré-ball coordinate
  p = x / (1 + √c x₀) is conformal (the ball's metric is (2/δ)² times the Euclidean one, with
  δ = 1 − c‖p‖²), so Euclidean neighbourhoods have hyperbolic shapes and only their scale
  varies with radius; exactly, cosh(√c d(p,q)) = 1 + 2c‖p − q‖² / (δ_p δ_q). An L2 HNSW over p
  proposes k′ candidates (the exact top-10 fell within the first 50 L2 neighbours for 98 % of
  queries at radius 6, against 63 % for the tangent vectors), and each row also stores δ,
  computed in float64, so that x = 2p/δ comes back to float32 precision near the boundary,
  where 1 − c‖p‖² from float32 p would cancel.
* ``lifted`` — exact search for galleries at many radii: a FLAT inner-product scan over
  x̃ = (x₀, x) with the query (−q₀, q) scores ⟨q,x⟩_L (exact in real arithmetic; float32
  cancels far from the origin, which the over-fetch and the float64 re-rank repair, as in
  ``app.vectors.faiss.index``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import torch

from app.ml.geometry.lorentz import exp_map0, log_map0
from app.vectors.lorentz_rows import lifted_gallery, lifted_queries

Layout = Literal["cosine", "tangent", "poincare", "lifted"]
LAYOUTS: tuple[str, ...] = ("cosine", "tangent", "poincare", "lifted")
# Engine metric of each layout's search vectors (Milvus names).
LAYOUT_METRIC: dict[str, str] = {
    "cosine": "COSINE",
    "tangent": "L2",
    "poincare": "L2",
    "lifted": "IP",
}
# Relative spread of radii still called "one radius": the lift of unit vectors computes every
# radius from the same scale, so only float32 rounding of the stored components separates them.
ONE_RADIUS_TOLERANCE = 1e-4
DEFAULT_HNSW = {"m": 32, "ef_construction": 200}
COLLECTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
# The poincare layout's per-row scalar δ = 1 − c‖p‖² (float64 → FLOAT: relative precision kept
# where δ is tiny, which 1 − c‖p‖² from the float32 ball coordinates would not be).
GAP_FIELD = "gap"


def choose_layout(one_radius: bool, exact: bool) -> tuple[Layout, str]:
    """(layout, index type): COSINE HNSW (FLAT when exact) for one-radius galleries; otherwise
    an L2 HNSW over Poincaré-ball coordinates, or an exact FLAT scan over lifted vectors."""
    if one_radius:
        return "cosine", "FLAT" if exact else "HNSW"
    return ("lifted", "FLAT") if exact else ("poincare", "HNSW")


def search_dim(layout: str, point_dim: int) -> int:
    return point_dim + 1 if layout == "lifted" else point_dim


def radii(points: np.ndarray, curv: float) -> np.ndarray:
    """d(o,x) = asinh(√c‖x‖)/√c per row, in float64."""
    norms = np.linalg.norm(np.asarray(points, dtype=np.float64), axis=-1)
    return np.arcsinh(np.sqrt(curv) * norms) / np.sqrt(curv)


def at_one_radius(points: np.ndarray, curv: float) -> bool:
    """Whether every row lies at the same radius (up to float32 rounding of its components)."""
    if len(points) == 0:
        return True
    r = radii(points, curv)
    return bool(r.max() - r.min() <= ONE_RADIUS_TOLERANCE * max(r.max(), 1.0))


def _tangent(points: np.ndarray, curv: float) -> np.ndarray:
    with torch.no_grad():
        return log_map0(torch.from_numpy(np.asarray(points, dtype=np.float64)), curv).numpy()


def poincare(points: np.ndarray, curv: float) -> np.ndarray:
    """Poincaré-ball coordinates p = x / (1 + √(1 + c‖x‖²)) of space components x, in float64
    (√c x₀ = √(1 + c‖x‖²) on the hyperboloid ⟨x,x⟩_L = −1/c; ‖p‖ = tanh(√c d(o,x)/2)/√c)."""
    x = np.asarray(points, dtype=np.float64)
    return x / (1.0 + np.sqrt(1.0 + curv * (x**2).sum(-1, keepdims=True)))


def boundary_gap(points: np.ndarray, curv: float) -> np.ndarray:
    """δ = 1 − c‖p‖² = 2 / (1 + √(1 + c‖x‖²)) per row, in float64 from the space components (not
    from p, whose float32 rounding would cancel in 1 − c‖p‖² near the boundary)."""
    x = np.asarray(points, dtype=np.float64)
    return 2.0 / (1.0 + np.sqrt(1.0 + curv * (x**2).sum(-1)))


def points_from_poincare(p: np.ndarray, gap: np.ndarray) -> np.ndarray:
    """Space components x = 2p/δ (float64) from ball coordinates and their stored gaps δ."""
    return 2.0 * np.asarray(p, dtype=np.float64) / np.asarray(gap, dtype=np.float64)[..., None]


def gallery_search_vectors(layout: str, points: np.ndarray, curv: float) -> np.ndarray:
    """float32 rows the engine indexes for space components ``points`` (N × d)."""
    points = np.asarray(points)
    if layout == "cosine":
        return np.ascontiguousarray(points, dtype=np.float32)
    if layout == "tangent":
        return _tangent(points, curv).astype(np.float32)
    if layout == "poincare":
        return poincare(points, curv).astype(np.float32)
    if layout == "lifted":
        return lifted_gallery(points, curv)
    raise ValueError(f"unknown layout {layout!r}, expected one of {LAYOUTS}")


def query_search_vectors(layout: str, queries: np.ndarray, curv: float) -> np.ndarray:
    """float32 query rows for the engine: q itself (cosine), log₀(q) (tangent), its ball
    coordinates (poincare), (−q₀, q) (lifted, so that the inner product is the Lorentz one)."""
    if layout == "lifted":
        return lifted_queries(queries, curv)
    return gallery_search_vectors(layout, queries, curv)


def points_from_search_vectors(
    layout: str, vectors: np.ndarray, curv: float, gap: np.ndarray | None = None
) -> np.ndarray:
    """Space components (float64) back from indexed rows, for the exact re-rank (``gap``: the
    rows' stored δ, which the poincare layout needs)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    if layout == "poincare":
        if gap is None:
            raise ValueError("the poincare layout needs each row's stored gap δ")
        return points_from_poincare(vectors, gap)
    if layout == "cosine":
        return vectors
    if layout == "lifted":
        return vectors[..., 1:]
    if layout == "tangent":
        with torch.no_grad():
            return exp_map0(torch.from_numpy(vectors), curv).numpy()
    raise ValueError(f"unknown layout {layout!r}, expected one of {LAYOUTS}")


@dataclass(frozen=True)
class GalleryLayout:
    """How one gallery is stored: its vectors' sizes, curvature and search layout.

    ``dim`` is the stored vector's size, ``point_dim`` that of its space components (equal for
    model-bound galleries and for lifts, which keep the dimension). ``lift_scale`` (cosine layout
    only) says the points are the cosine lift exp₀(scale·v/‖v‖) of the stored vectors v, as in an
    external cosine gallery: v's direction is then the point's, so the collection indexes the
    stored vector itself (COSINE) and computes the points from it — one vector per row, not two
    (measured: a second vector field halves milvus-lite's ingest rate)."""

    collection: str
    dim: int
    point_dim: int
    curv: float
    layout: str
    index_type: str = "HNSW"
    hnsw: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_HNSW))
    lift_scale: float | None = None

    def __post_init__(self) -> None:
        if not COLLECTION_NAME.match(self.collection):
            raise ValueError(f"collection name {self.collection!r}: letters, digits, underscores")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}, expected one of {LAYOUTS}")
        if self.index_type not in ("HNSW", "FLAT"):
            raise ValueError("index_type must be HNSW or FLAT")
        if self.layout == "lifted" and self.index_type != "FLAT":
            # Graphs and clusters built from lifted inner products lose most neighbours.
            raise ValueError("the lifted layout is only searched by a FLAT scan")
        if self.dim < 1 or self.point_dim < 1 or not self.curv > 0:
            raise ValueError("dim and point_dim must be ≥ 1 and curv > 0")
        if self.lift_scale is not None and not (
            self.layout == "cosine" and self.lift_scale > 0 and self.dim == self.point_dim
        ):
            raise ValueError("lift_scale: a positive scale of a cosine layout (dim = point_dim)")

    @property
    def search_field(self) -> str:
        """The vector field searched: the stored vector itself under a cosine lift."""
        return "search" if self.lift_scale is None else "vector"

    @property
    def search_width(self) -> int:
        return self.dim if self.lift_scale is not None else search_dim(self.layout, self.point_dim)

    @property
    def gap_field(self) -> str | None:
        """The scalar the re-rank needs beside the indexed row (the poincare layout's δ)."""
        return GAP_FIELD if self.layout == "poincare" else None

    @property
    def metric(self) -> str:
        return LAYOUT_METRIC[self.layout]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GalleryLayout:
        return cls(**json.loads(text))
