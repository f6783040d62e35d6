"""Searching a Milvus gallery: candidates from the collection's index, ordered exactly.

``search`` asks Milvus for k′ candidates per query from the layout's index
(``app.vectors.milvus.layouts``), fetched with their indexed rows (and the poincare layout's stored
gap), and orders them by float64 Lorentz distance (``reranked``), so the engine's float32 scores
never decide the final order. A k above a Milvus server's top-k cap is answered by an exact scan
of every row instead (``scanned``). ``MilvusGallery.search`` is this module's ``search``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from app.vectors.lorentz_rows import cosine_lift
from app.vectors.milvus.layouts import (
    GalleryLayout,
    points_from_search_vectors,
    query_search_vectors,
)
from app.vectors.milvus.results import candidate_rows
from app.vectors.rerank import RERANK_BUDGET, exact_top_k, rerank


class Tuning(Protocol):
    """An engine's k′ and ef factor for every layout (None: the layout's defaults)."""

    @property
    def overfetch(self) -> int | None: ...

    @property
    def ef_factor(self) -> int | None: ...


class Searched(Protocol):
    """What a search reads of a gallery (``app.vectors.milvus.engine.MilvusGallery`` is one):
    declared here, so that the engine imports its search and the search never imports the
    engine back."""

    @property
    def engine(self) -> Tuning: ...

    @property
    def layout(self) -> GalleryLayout: ...

    @property
    def client(self) -> Any: ...

    @property
    def name(self) -> str: ...

    def row_batches(self, batch_size: int, fields: list[str]) -> Iterator[list[dict[str, Any]]]:
        """The rows' ``fields`` in batches of ascending internal id."""
        ...


# Candidates fetched per query before the exact re-rank (k′), and the tangent layout's HNSW
# search-time ef as a multiple of k′ (ef = factor × k′; ef < k′ would cap the candidate list).
# Chosen on two validation galleries of the benchmark's size, never the benchmark's (seeds 7 and
# 8, 100k rows, radii 1 / 3 / 6):
#   python -m bench.perf.engines --validate --rows 100000 --seed 7   → bench/results/engines_validation.json
#   python -m bench.perf.engines --validate --rows 100000 --seed 8   → …/engines_validation_seed8.json
# the only grid point with tangent recall@10 ≥ 0.95 at every radius on both (0.959 / 0.989 /
# 0.991 and 0.954 / 0.991 / 0.983). Radius 6 is limited by the tangent ordering (k′ = 100 stays
# below 0.88 at any ef; k′ = 200 gave 0.942 on seed 8), radius 1 by the graph walk (recall rose
# with ef at any k′: 0.924 / 0.941 / 0.949 at ef 400 / 800 / 1600, k′ = 200, seed 8). In
# milvus-lite a wider ef costs little; the hits returned cost more (k′ 300: about 13 queries/s
# at batch 256, k′ 200: 17–20). Earlier choices fell short on the benchmark gallery: k′ 200 with
# ef 400 (from one 30k-row gallery) at radius 1, with ef 1600 (from seed 7 alone) at radius 6.
DEFAULT_OVERFETCH = 300
DEFAULT_EF_FACTOR = 8
# The same two for the poincare layout (new galleries at many radii), whose L2 order is close to
# the hyperbolic one, chosen the same way (seeds 7 and 8, 100k rows; bench/results/
# engines_validation_poincare_seed{7,8}.json, and …_r1.json for radius 1 at ef up to 4800):
# radius 6 needs k′ 100 (k′ 50: 0.971 / 0.950, k′ 100: 0.998 / 0.999 at ef 800), radius 3 is
# ≥ 0.987 there; radius 1 is limited by the graph walk alone (the same recall at every k′ from
# 30 to 150 at a given ef) and first reaches 0.95 on both seeds at ef 3200 (0.949 at 2400 on
# seed 8). A third of the tangent layout's hits, and a wider walk.
POINCARE_OVERFETCH = 100
POINCARE_EF_FACTOR = 32
# Extra candidates of a cosine layout, whose engine ranking is already the Lorentz one (0: the
# engine's top k are the answer; the re-rank only gives them float64 distances). A margin would
# only absorb float32 ties at the k-th place, at the price of fetching more vectors per query.
COSINE_MARGIN = 0
# Hits (queries × limit) asked of Milvus in one search request. Measured with milvus-lite 3.2 on a
# 30k-row tangent gallery: 32 queries × 100 candidates answered in a few MiB, 64 × 100 grew the
# process past 6 GiB (and 256 × 100 on 100k rows was killed by the OOM killer at 17 GiB); so a
# batch is sent in requests of at most this many hits.
MAX_HITS_PER_REQUEST = 2048
# The largest search limit a Milvus server accepts (its default ``topKLimit``; milvus-lite has no
# cap). Partial backfill's mixed search can ask for more on a gallery with many re-embedded items;
# such a search scans the collection exactly instead (``MilvusGallery.search``).
MAX_TOPK = 16384


@dataclass
class SearchHits:
    """Per query the k nearest item ids ('' padded), their internal ids (−1 padded), float64
    distances (inf padded) and the hits' points (nq × k × point_dim float64, NaN padded: the
    space components the distances were computed from; None for hits built elsewhere, as the
    benchmark's FAISS ones)."""

    item_ids: list[list[str]]
    distances: np.ndarray
    row_ids: np.ndarray
    points: np.ndarray | None = None


def search_defaults(layout: str) -> tuple[int, int]:
    """A layout's (k′, ef factor) when neither the search nor the engine sets them."""
    if layout == "poincare":
        return POINCARE_OVERFETCH, POINCARE_EF_FACTOR
    return DEFAULT_OVERFETCH, DEFAULT_EF_FACTOR


def search(
    gallery: Searched,
    queries: np.ndarray,
    k: int,
    *,
    overfetch: int | None = None,
    ef_factor: int | None = None,
) -> SearchHits:
    """The k nearest items per query (space components in the gallery's frame), nearest first,
    by exact float64 Lorentz distance among the engine's candidates (``MilvusGallery.search``).
    ``overfetch`` / ``ef_factor``: this search's k′ and ef factor, else the engine's, else the
    layout's defaults (``search_defaults``)."""
    layout = gallery.layout
    queries = np.asarray(queries, dtype=np.float64).reshape(-1, layout.point_dim)
    if k < 1:
        raise ValueError("k must be ≥ 1")
    if ef_factor is not None and ef_factor < 1:
        raise ValueError("ef_factor must be ≥ 1")
    if k > MAX_TOPK:
        return scanned(gallery, queries, k)
    default_overfetch, default_factor = search_defaults(layout.layout)
    overfetch = overfetch or gallery.engine.overfetch or default_overfetch
    fetch_k = min(max(k, overfetch), MAX_TOPK)
    limit = min(fetch_k, k + COSINE_MARGIN) if layout.layout == "cosine" else fetch_k
    params: dict[str, Any] = {"metric_type": layout.metric}
    if layout.index_type == "HNSW":
        # ef bounds the candidate list the graph walk keeps; below the limit it would cap it.
        # A cosine layout is exact at ef = k′ already; the tangent one walks wider.
        factor = (
            1
            if layout.layout == "cosine"
            else (ef_factor or gallery.engine.ef_factor or default_factor)
        )
        params["params"] = {"ef": factor * max(fetch_k, limit)}
    # The re-rank holds queries × candidates × dim float64 values: bound that working set.
    chunk = RERANK_BUDGET // (limit * layout.search_width)
    chunk = max(1, min(chunk, MAX_HITS_PER_REQUEST // limit))
    empty = np.empty((0, k, layout.point_dim))
    parts = [SearchHits([], np.empty((0, k)), np.empty((0, k), dtype=np.int64), empty)]
    for start in range(0, len(queries), chunk):
        part = queries[start : start + chunk]
        results = gallery.client.search(
            gallery.name,
            data=query_search_vectors(layout.layout, part, layout.curv),
            limit=limit,
            anns_field=layout.search_field,
            search_params=params,
            output_fields=[layout.search_field, "row_id", *gap_fields(layout)],
        )
        parts.append(reranked(layout, part, results, k, limit))
    return SearchHits(
        [ids for hits in parts for ids in hits.item_ids],
        np.concatenate([hits.distances for hits in parts]),
        np.concatenate([hits.row_ids for hits in parts]),
        np.concatenate([hits.points for hits in parts if hits.points is not None]),
    )


def scanned(gallery: Searched, queries: np.ndarray, k: int) -> SearchHits:
    """The exact top k by a scan of every row (for k above the engine's top-k cap): each
    batch read from the collection gives its exact top k (``exact_top_k``), merged into a
    running top k by exact distance. Memory holds nq × 2k float32 points, the size of the
    hits the FAISS path returns for such a k."""
    layout = gallery.layout
    nq = len(queries)
    best_dist = np.empty((nq, 0))
    best_rows = np.empty((nq, 0), dtype=np.int64)
    best_points = np.empty((nq, 0, layout.point_dim), dtype=np.float32)
    names: dict[int, str] = {}
    for item_ids, row_ids, points in scan_points(gallery):
        names.update(zip(row_ids.tolist(), item_ids, strict=True))
        positions, dist = exact_top_k(queries, points, min(k, len(points)), layout.curv)
        dist = np.concatenate([best_dist, dist], axis=1)
        rows = np.concatenate([best_rows, row_ids[positions]], axis=1)
        candidates = np.concatenate([best_points, points[positions].astype(np.float32)], 1)
        keep = np.argsort(dist, axis=1, kind="stable")[:, :k]
        best_dist = np.take_along_axis(dist, keep, 1)
        best_rows = np.take_along_axis(rows, keep, 1)
        best_points = np.take_along_axis(candidates, keep[:, :, None], 1)
    found = best_dist.shape[1]
    distances = np.full((nq, k), np.inf)
    distances[:, :found] = best_dist
    row_ids = np.full((nq, k), -1, dtype=np.int64)
    row_ids[:, :found] = best_rows
    hit_points = np.full((nq, k, layout.point_dim), np.nan)
    hit_points[:, :found] = best_points
    item_ids = [[names[int(r)] if r >= 0 else "" for r in row] for row in row_ids]
    return SearchHits(item_ids, distances, row_ids, hit_points)


def gap_fields(layout: GalleryLayout) -> list[str]:
    """The scalar fields a search reads beside the indexed row."""
    return [] if layout.gap_field is None else [layout.gap_field]


def scan_points(
    gallery: Searched, batch_size: int = 4096
) -> Iterator[tuple[list[str], np.ndarray, Any]]:
    """(item ids, internal ids, float64 points) of every row, in batches."""
    layout = gallery.layout
    field_name = layout.search_field
    fields = ["item_id", "row_id", field_name, *gap_fields(layout)]
    for rows in gallery.row_batches(batch_size, fields):
        vectors = np.array([row[field_name] for row in rows], dtype=np.float32)
        gaps = None
        if layout.gap_field is not None:
            gaps = np.array([row[layout.gap_field] for row in rows], dtype=np.float64)
        if layout.lift_scale is None:
            points = points_from_search_vectors(layout.layout, vectors, layout.curv, gaps)
        else:
            # float32 like ``reranked``'s, so both paths give one item one distance.
            points = cosine_lift(vectors, layout.lift_scale, layout.curv).astype(np.float32)
        yield (
            [row["item_id"] for row in rows],
            np.array([row["row_id"] for row in rows], dtype=np.int64),
            np.asarray(points, dtype=np.float64),
        )


def reranked(
    layout: GalleryLayout, queries: np.ndarray, results: Any, k: int, limit: int
) -> SearchHits:
    """One search response's candidates ordered by exact float64 Lorentz distance."""
    nq = len(queries)
    found = candidate_rows(
        results, nq, limit, layout.search_width, layout.search_field, layout.gap_field
    )
    candidate_ids, candidate_rows_ids = found.item_ids, found.row_ids
    if layout.lift_scale is None:
        points = points_from_search_vectors(layout.layout, found.rows, layout.curv, found.gaps)
    else:
        # Rounded to float32 like the points the service lifts (its queries among them), so
        # that an item's own vector is found at distance 0, as by the FAISS path.
        points = cosine_lift(found.rows, layout.lift_scale, layout.curv).astype(np.float32)
    positions, distances = rerank(queries, points, found.valid, k, layout.curv)
    item_ids = [[candidate_ids[q][p] if p >= 0 else "" for p in positions[q]] for q in range(nq)]
    at = np.maximum(positions, 0)
    row_ids = np.where(positions >= 0, np.take_along_axis(candidate_rows_ids, at, 1), -1)
    hit_points = np.take_along_axis(np.asarray(points, np.float64), at[:, :, None], 1)
    hit_points[positions < 0] = np.nan
    return SearchHits(item_ids, distances, row_ids, hit_points)
