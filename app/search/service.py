"""Search a gallery with vectors of its own space or with a trained model's input features."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.arrays import as_matrix, check_batch_size
from app.core.errors import invalid
from app.core.settings import Settings
from app.galleries.models import Gallery, GalleryVector
from app.galleries.service import IN_CHUNK, index_for, lifted_points
from app.models.service import ModelCache, embed_features, frame_map, get_model
from app.search.schemas import SearchRequest
from app.search.store import IndexStore


@dataclass(frozen=True)
class SearchQuery:
    """A search after parsing: rows from JSON (lists) or from a ``.npy`` body (an array)."""

    vectors: Sequence[Sequence[float]] | np.ndarray
    k: int
    model_id: str | None = None
    modality: str | None = None

    @classmethod
    def of(cls, request: SearchRequest) -> SearchQuery:
        return cls(request.vectors, request.k, request.model_id, request.modality)


def _queries(
    session: Session,
    settings: Settings,
    cache: ModelCache,
    tenant_id: str,
    gallery: Gallery,
    request: SearchQuery,
) -> np.ndarray:
    """The queries as space components in the gallery's frame."""
    if request.model_id is None:
        if request.modality is not None:
            raise invalid("modality", "only applies together with model_id")
        vectors = as_matrix(request.vectors, "vectors", dim=gallery.dim, max_dim=settings.max_dim)
        return lifted_points(gallery, vectors)
    row = get_model(session, tenant_id, request.model_id)
    to_gallery = frame_map(session, row, gallery)
    points, _ = embed_features(cache, settings, row, request.vectors, request.modality, "vectors")
    return to_gallery(points)


def search_gallery(
    session: Session,
    settings: Settings,
    store: IndexStore,
    cache: ModelCache,
    tenant_id: str,
    gallery: Gallery,
    request: SearchQuery | SearchRequest,
) -> list[list[dict[str, Any]]]:
    if isinstance(request, SearchRequest):
        request = SearchQuery.of(request)
    if request.k > settings.max_k:
        raise invalid("k", f"must be ≤ {settings.max_k}")
    check_batch_size(len(request.vectors), "vectors", settings.max_vectors_per_request)
    queries = _queries(session, settings, cache, tenant_id, gallery, request)
    index = index_for(session, store, gallery)
    ids, distances = index.search(
        queries,
        request.k,
        overfetch=settings.search_overfetch,
        min_candidates=settings.search_min_candidates,
    )
    wanted = sorted({int(i) for i in ids[ids >= 0]})
    items: dict[int, tuple[str, str | None]] = {}
    for start in range(0, len(wanted), IN_CHUNK):
        rows = session.execute(
            select(GalleryVector.id, GalleryVector.item_id, GalleryVector.label).where(
                GalleryVector.id.in_(wanted[start : start + IN_CHUNK])
            )
        )
        items.update((row_id, (item_id, label)) for row_id, item_id, label in rows)
    results = []
    for row_ids, row_dist in zip(ids.tolist(), distances.tolist(), strict=True):
        hits = []
        for faiss_id, distance in zip(row_ids, row_dist, strict=True):
            # A vector deleted between the index read and this lookup is simply skipped.
            if faiss_id < 0 or faiss_id not in items:
                continue
            item_id, label = items[faiss_id]
            hit: dict[str, Any] = {"id": item_id, "distance": distance}
            if label is not None:
                hit["label"] = label
            hits.append(hit)
        results.append(hits)
    return results
