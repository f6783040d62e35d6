"""An in-place migration's vector in an attached Qdrant collection: the re-embedded items' new
features as a second, named vector (``nobackfill_<model id>``) of the user's own points.

Why the same points and not a new collection: the ids, the payload and the old vector stay where
the owner's own tools read them, and a point deleted by the owner takes its new vector with it.
The service never writes the gallery's own vector: it adds a named vector to the live collection
(``create_vector_name``: Qdrant servers since 1.18, and qdrant-client's local mode), writes only
that vector of the re-embedded points (``update_vectors`` leaves a point's other vectors as they
are) and records per-vector provenance in the payload: ``nobackfill_models`` maps each model id
whose vector the point carries to when it was written (``set_payload`` with ``key`` touches that
key only; the owner's payload stays).

Searches read the vector by name (the re-embedded points only) and the old vector with a filter
keeping the points that lack it (``QdrantSearcher.search_with_points(without=…)``): the two
lists of a mixed search come from the collection itself, so they can never overlap.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import numpy as np
from qdrant_client import models

from app.core.errors import conflict
from app.core.settings import Settings
from app.ml.backfill.mixed import unit_rows
from app.vectors import attached_ids
from app.vectors.engine import StoredGallery
from app.vectors.lorentz_rows import best_by_id
from app.vectors.qdrant.source import MIGRATION_PREFIX, QdrantSource, connection, reachable
from app.vectors.qdrant.storage import (
    READ_BATCH,
    SEARCH_BATCH,
    QdrantVectorStorage,
    asker,
    past_ties,
    scroll,
)

log = logging.getLogger(__name__)
PAYLOAD_KEY = "nobackfill_models"


def migration_vector(model_id: str) -> str:
    """The named vector holding ``model_id``'s re-embedded items."""
    return MIGRATION_PREFIX + model_id


def _named(vectors: object) -> dict[str, models.VectorParams]:
    # A collection of one unnamed vector reports bare VectorParams: it has no named one yet.
    return dict(vectors) if isinstance(vectors, dict) else {}


def vector_params(
    storage: QdrantVectorStorage, gallery: StoredGallery, name: str
) -> models.VectorParams | None:
    """The named vector's parameters, None when the collection has no such vector."""
    source = storage.source(gallery)
    with reachable(source), connection(storage.settings, source).use() as client:
        vectors = client.get_collection(source.collection).config.params.vectors
    return _named(vectors).get(name)


def ensure_vector(
    storage: QdrantVectorStorage, gallery: StoredGallery, name: str, dim: int
) -> None:
    """Add the named vector (Cosine, ``dim``) to the live collection unless it has it; 409 when
    a vector of that name exists with another shape (not the service's to change)."""
    existing = vector_params(storage, gallery, name)
    if existing is None:
        source = storage.source(gallery)
        config = models.DenseVectorNameConfig(
            dense=models.DenseVectorConfig(size=dim, distance=models.Distance.COSINE)
        )
        with reachable(source), connection(storage.settings, source).use() as client:
            client.create_vector_name(source.collection, name, config)
        return
    if existing.size != dim or existing.distance != models.Distance.COSINE:
        raise conflict(
            f"the collection's vector {name!r} is {existing.size}-dimensional "
            f"{existing.distance.value}, not the model's {dim}-dimensional Cosine features; "
            "it is not the service's to change"
        )


def write(
    storage: QdrantVectorStorage,
    gallery: StoredGallery,
    name: str,
    model_id: str,
    points: Sequence[attached_ids.PointId],
    features: np.ndarray,
    written_at: str,
) -> None:
    """The named vector of ``points`` (rows of ``features``) and their provenance."""
    source = storage.source(gallery)
    conn = connection(storage.settings, source)
    for start in range(0, len(points), READ_BATCH):
        part = list(points[start : start + READ_BATCH])
        rows = features[start : start + READ_BATCH]
        vectors = [
            models.PointVectors(id=p, vector={name: r.astype(np.float32).tolist()})
            for p, r in zip(part, rows, strict=True)
        ]
        with reachable(source), conn.use() as client:
            client.update_vectors(source.collection, points=vectors)
            client.set_payload(
                source.collection, payload={model_id: written_at}, points=part, key=PAYLOAD_KEY
            )


def remove_model(settings: Settings, source: QdrantSource, model_id: str) -> int:
    """Take ``model_id``'s writes out of the collection: its named vector and its entry in the
    points' provenance (the payload key goes with its last entry); every point, its own vectors
    and the rest of its payload stay. Returns the points whose provenance named the model."""
    conn = connection(settings, source)
    name = migration_vector(model_id)
    entry = f"{PAYLOAD_KEY}.{model_id}"
    naming = models.Filter(
        must_not=[models.IsEmptyCondition(is_empty=models.PayloadField(key=entry))]
    )
    only, shared = [], []
    for records in scroll(settings, source, READ_BATCH, payload=[PAYLOAD_KEY], only=naming):
        for record in records:
            written = (record.payload or {}).get(PAYLOAD_KEY) or {}
            (only if set(written) <= {model_id} else shared).append(record.id)
    with reachable(source), conn.use() as client:
        for keys, points in (([PAYLOAD_KEY], only), ([entry], shared)):
            for start in range(0, len(points), READ_BATCH):
                client.delete_payload(
                    source.collection, keys=keys, points=points[start : start + READ_BATCH]
                )
        vectors = client.get_collection(source.collection).config.params.vectors
        if name in _named(vectors):
            client.delete_vector_name(source.collection, name)
    return len(only) + len(shared)


def forget_models(
    settings: Settings, gallery_id: str, source: QdrantSource, model_ids: Iterable[str]
) -> None:
    """``remove_model`` for each model, once its re-embedded items were deleted (committed).
    Best effort: a collection out of reach keeps them (logged); no search reads them any more."""
    for model_id in model_ids:
        try:
            remove_model(settings, source, model_id)
        except Exception:
            log.warning(
                "could not remove model %s's vectors from gallery %s's collection",
                model_id,
                gallery_id,
                exc_info=True,
            )


def search_vector(
    storage: QdrantVectorStorage, gallery: StoredGallery, name: str, features: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """(internal ids, cosines) of the k points nearest each row of ``features`` by the named
    vector, best first (ids −1 padded). The cosines are recomputed from the hits' vectors in
    float32 as the service's own scan of re-embedded features computes them, so the merge
    scores a hit the same wherever its features are kept."""
    source = storage.source(gallery)
    conn = connection(storage.settings, source)
    queries = unit_rows(features)
    nq = len(queries)
    ids = np.full((nq, k), -1, dtype=np.int64)
    cosines = np.full((nq, k), -1.0, dtype=np.float32)

    def request(query: np.ndarray, limit: int) -> models.QueryRequest:
        return models.QueryRequest(
            query=query.tolist(), using=name, limit=limit, with_vector=[name], with_payload=False
        )

    for start in range(0, nq, SEARCH_BATCH):
        part = queries[start : start + SEARCH_BATCH]
        with reachable(source), conn.use() as client:
            answers = client.query_batch_points(
                source.collection, requests=[request(q, k + 1) for q in part]
            )
        for offset, answer in enumerate(answers):
            hits = past_ties(asker(source, conn, request, part[offset]), answer.points, k)
            if not hits:
                continue
            attached_ids.remember(gallery.id, [h.id for h in hits])
            hit_ids = np.array([attached_ids.internal_of(h.id) for h in hits], dtype=np.int64)
            found = unit_rows(np.asarray([h.vector[name] for h in hits], dtype=np.float32))
            best, scores = best_by_id(hit_ids[None], (found @ part[offset])[None], k)
            row = start + offset
            ids[row, : best.shape[1]] = best[0]
            cosines[row, : best.shape[1]] = scores[0]
    return ids, cosines
