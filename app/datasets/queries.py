"""A dataset's query log: logged queries by the new backbone, optionally also by the old model,
optionally with the gallery items each is about. Upserted by query id, all or nothing.

Queries belong to a gallery-linked dataset only: their relevant ids are that gallery's item ids
and their old vectors live in its space. A dataset's queries all have old vectors or none do, so
the log reaches the trainer as one matrix (``QueryLog.old_vectors``) with nothing dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from app.core.arrays import as_matrix, check_batch_size, check_count, check_ids
from app.core.errors import FieldError, Problem, invalid, invalid_fields
from app.core.settings import Settings
from app.datasets.models import Dataset, DatasetQuery
from app.datasets.service import gallery_ids_present, lock_dataset
from app.galleries.models import Gallery
from app.galleries.service import IN_CHUNK

# A query is about a handful of documents; thousands is a misplaced gallery, not relevance.
MAX_RELEVANT_PER_QUERY = 1000
MAX_ERRORS = 20


@dataclass
class LoggedQueries:
    """A dataset's query log as stored, ordered by query id."""

    ids: list[str]
    features: np.ndarray  # Q×D float32
    old_vectors: np.ndarray | None  # Q×d float32 when every query has one
    relevant_ids: list[list[str]]  # per query, gallery item ids (empty: none given)


def _single_matrix(value: Any, field: str) -> Any:
    """Multipart gathers ``features.<x>`` parts into a dict (several modalities); queries have
    one matrix per field."""
    if isinstance(value, dict):
        raise invalid_fields(
            [
                FieldError(f"{field}.{name}", f"not accepted: send one part named {field!r}")
                for name in value
            ]
        )
    return value


def _check_relevant(
    relevant: Any, n: int, *, with_old_vectors: bool, max_id_length: int
) -> list[list[str]]:
    """Shape and id rules of ``relevant_ids`` (a JSON part in multipart uploads is unchecked)."""
    if not isinstance(relevant, list):
        raise invalid("relevant_ids", "expected an array with one array of item ids per query")
    check_count(len(relevant), "relevant_ids", n)
    errors: list[FieldError] = []
    for q, items in enumerate(relevant):
        field = f"relevant_ids[{q}]"
        if not isinstance(items, list):
            errors.append(FieldError(field, "expected an array of gallery item ids"))
        elif not items and not with_old_vectors:
            errors.append(
                FieldError(field, "empty: without old_vectors every query needs relevant ids")
            )
        elif len(items) > MAX_RELEVANT_PER_QUERY:
            errors.append(
                FieldError(field, f"{len(items)} ids exceed {MAX_RELEVANT_PER_QUERY} per query")
            )
        elif items:
            try:
                check_ids(items, field, max_length=max_id_length)
            except Problem as problem:
                errors.extend(problem.errors)
        if len(errors) >= MAX_ERRORS:
            break
    if errors:
        raise invalid_fields(errors[:MAX_ERRORS])
    return relevant


def _check_known(session: Session, gallery_id: str, relevant: list[list[str]]) -> None:
    known = gallery_ids_present(session, gallery_id, [i for items in relevant for i in items])
    errors = [
        FieldError(f"relevant_ids[{q}][{j}]", f"{item_id!r} is not in gallery {gallery_id}")
        for q, items in enumerate(relevant)
        for j, item_id in enumerate(items)
        if item_id not in known
    ]
    if errors:
        raise invalid_fields(errors[:MAX_ERRORS])


def _check_old_vectors_consistent(
    session: Session, dataset: Dataset, ids: list[str], with_old_vectors: bool
) -> None:
    """Refuse a batch that would leave the log with old vectors for some queries only (the
    dataset row is locked, so its counts are current)."""
    replaced_with = replaced = 0
    for start in range(0, len(ids), IN_CHUNK):
        for has_old in session.scalars(
            select(DatasetQuery.old_vector.is_not(None)).where(
                DatasetQuery.dataset_id == dataset.id,
                DatasetQuery.query_id.in_(ids[start : start + IN_CHUNK]),
            )
        ):
            replaced += 1
            replaced_with += bool(has_old)
    kept = dataset.query_count - replaced
    kept_with = dataset.queries_with_old_vectors - replaced_with
    if with_old_vectors and kept_with < kept:
        raise invalid(
            "old_vectors",
            f"{kept - kept_with} of this dataset's other queries have no old vectors: a query log "
            "has old vectors for every query or for none (DELETE the queries to start over)",
        )
    if not with_old_vectors and kept_with > 0:
        raise invalid(
            "old_vectors",
            f"required: this dataset's other {kept_with} queries have old vectors, and a query "
            "log has them for every query or for none",
        )


def upsert_queries(
    session: Session,
    settings: Settings,
    dataset: Dataset,
    ids: Sequence[Any],
    features: Any,
    old_vectors: Any,
    relevant_ids: Any,
) -> int:
    """Validate everything, then replace the rows of these query ids in one transaction."""
    if dataset.gallery_id is None:
        raise Problem(
            409,
            "Conflict",
            f"dataset {dataset.id} has no gallery: queries are about gallery items and their "
            "old vectors live in a gallery's space; create the dataset with a gallery_id",
        )
    gallery = session.get(Gallery, dataset.gallery_id)
    check_batch_size(len(ids), "ids", settings.max_vectors_per_request)
    ids = check_ids(ids, "ids", max_length=settings.max_id_length)
    if old_vectors is None and relevant_ids is None:
        raise invalid_fields(
            [
                FieldError("old_vectors", "give old_vectors, relevant_ids or both"),
                FieldError("relevant_ids", "give old_vectors, relevant_ids or both"),
            ]
        )
    modality = dataset.modalities[0]
    features = _single_matrix(features, "features")
    check_count(len(features), "features", len(ids))
    dim = dataset.dims.get(modality)
    matrix = as_matrix(features, "features", dim=dim, max_dim=settings.max_dim)
    old = None
    if old_vectors is not None:
        old_vectors = _single_matrix(old_vectors, "old_vectors")
        check_count(len(old_vectors), "old_vectors", len(ids))
        old = as_matrix(old_vectors, "old_vectors", dim=gallery.dim, max_dim=settings.max_dim)
    relevant: list[list[str]] = [[] for _ in ids]
    if relevant_ids is not None:
        relevant = _check_relevant(
            relevant_ids,
            len(ids),
            with_old_vectors=old is not None,
            max_id_length=settings.max_id_length,
        )
        _check_known(session, gallery.id, relevant)

    dataset = lock_dataset(session, dataset.id)
    locked_dim = dataset.dims.get(modality)
    if locked_dim is not None and locked_dim != matrix.shape[1]:
        raise invalid("features", f"expected dimension {locked_dim}, got {matrix.shape[1]}")
    _check_old_vectors_consistent(session, dataset, ids, old is not None)
    for start in range(0, len(ids), IN_CHUNK):
        session.execute(
            delete(DatasetQuery).where(
                DatasetQuery.dataset_id == dataset.id,
                DatasetQuery.query_id.in_(ids[start : start + IN_CHUNK]),
            )
        )
    session.execute(
        insert(DatasetQuery),
        [
            {
                "dataset_id": dataset.id,
                "query_id": query_id,
                "features": np.ascontiguousarray(matrix[n], dtype="<f4").tobytes(),
                "old_vector": (
                    None if old is None else np.ascontiguousarray(old[n], dtype="<f4").tobytes()
                ),
                "relevant_ids": relevant[n] or None,
            }
            for n, query_id in enumerate(ids)
        ],
    )
    dataset.dims = {**dataset.dims, modality: int(matrix.shape[1])}
    _recount(session, dataset)
    session.commit()
    return len(ids)


def _recount(session: Session, dataset: Dataset) -> None:
    total, with_old, with_relevance = session.execute(
        select(
            func.count(),
            func.count(DatasetQuery.old_vector),
            func.count(DatasetQuery.relevant_ids),
        ).where(DatasetQuery.dataset_id == dataset.id)
    ).one()
    dataset.query_count = int(total)
    dataset.queries_with_old_vectors = int(with_old)
    dataset.queries_with_relevance = int(with_relevance)


def delete_queries(session: Session, dataset: Dataset) -> int:
    """Clear the whole log; returns how many queries were deleted."""
    dataset = lock_dataset(session, dataset.id)
    deleted = dataset.query_count
    session.execute(delete(DatasetQuery).where(DatasetQuery.dataset_id == dataset.id))
    _recount(session, dataset)
    session.commit()
    return deleted


def load_queries(session: Session, dataset: Dataset) -> LoggedQueries | None:
    """The whole log, or None when the dataset has none."""
    rows = session.execute(
        select(
            DatasetQuery.query_id,
            DatasetQuery.features,
            DatasetQuery.old_vector,
            DatasetQuery.relevant_ids,
        )
        .where(DatasetQuery.dataset_id == dataset.id)
        .order_by(DatasetQuery.query_id)
        .execution_options(yield_per=5000)
    ).all()
    if not rows:
        return None
    dim = int(dataset.dims[dataset.modalities[0]])
    features = np.frombuffer(b"".join(r.features for r in rows), dtype="<f4").reshape(-1, dim)
    old = None
    if all(r.old_vector is not None for r in rows):
        old = np.frombuffer(b"".join(r.old_vector for r in rows), dtype="<f4").reshape(
            len(rows), -1
        )
    return LoggedQueries(
        ids=[r.query_id for r in rows],
        features=np.array(features),
        old_vectors=None if old is None else np.array(old),
        relevant_ids=[list(r.relevant_ids or []) for r in rows],
    )
