"""Partial backfill of an attached pgvector table, in place (issue 46, item 2): the pgvector twin
of ``app.migration.in_place.qdrant``, over the same counting (``rows.store_written``) and merge.

Re-embedded items are written into the owner's table, in a ``vector(D)`` column the service adds
per model (``app.vectors.pgvector.migration`` says how it is named, marked, indexed and dropped),
not into the service's store: the service keeps one row per item (``ReembeddedVector`` with
``features`` NULL) so that the plan, progress and deletes count them as they count any
gallery's. Mixed and transition searches run two exact searches of the table — the model's
column, and the old vector column among the rows whose model column is NULL — and go through the
same merge as every other gallery (``app.migration.mixed_search``).

Order of writes: the column first (added, then filled in one transaction), then the rows,
committed before the upload is acknowledged, as for Qdrant and Milvus. A row the owner deleted
after the plan listed it, or between the service's look-up and its write, is not among the rows
the ``UPDATE`` found: skipped and reported.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.core.errors import conflict
from app.core.settings import Settings
from app.galleries.models import Gallery
from app.migration.in_place.rows import refuse_unnamed, store_written
from app.migration.mixed_search import Lists
from app.migration.reembed import reembedded_count
from app.models.models import TrainedModel
from app.vectors import attached_ids
from app.vectors.faiss.index_store import IndexStore
from app.vectors.pgvector import migration as pg_migration
from app.vectors.pgvector import texts as pg_texts
from app.vectors.pgvector.source import PgvectorSource
from app.vectors.pgvector.storage import PgvectorSearcher, PgvectorStorage, pgvector_storage
from app.vectors.storage import session_settings


def store_in_place(
    session: Session,
    store: IndexStore,
    gallery: Gallery,
    row: TrainedModel,
    upload: tuple[list[str], np.ndarray],
) -> dict[str, Any]:
    """Write an upload (ids and features) into the model's column of the owner's table, and
    count them. Ids that cannot name a row answer 422 (nothing written); rows no longer in the
    table are skipped and listed under ``skipped``."""
    ids, matrix = upload
    storage = pgvector_storage(session_settings(session))
    string_ids = storage.source(gallery).string_ids
    refuse_unnamed(
        ids,
        lambda item: attached_ids.key_of(item, string_ids),
        "a text id" if string_ids else "an integer id in decimal",
    )
    return store_written(
        session,
        store,
        gallery,
        row,
        ids,
        lambda locked: _write_present(session, storage, locked, row.id, ids, matrix),
    )


def _write_present(
    session: Session,
    storage: PgvectorStorage,
    gallery: Gallery,
    model_id: str,
    ids: list[str],
    matrix: np.ndarray,
) -> dict[int, int]:
    """Position in ``ids`` → internal id, of the items written: those whose row (with its old
    vector) the ``UPDATE`` found."""
    source = storage.source(gallery)
    present = storage.lookup(session, gallery, ids)
    kept = [n for n, item in enumerate(ids) if item in present]
    if not kept:
        return {}
    pg_migration.ensure_column(storage.settings, source, model_id, matrix.shape[1])
    keys = [attached_ids.key_of(ids[n], source.string_ids) for n in kept]
    written = pg_migration.write(
        storage.settings, source, model_id, [k for k in keys if k is not None], matrix[kept]
    )
    return {n: present[ids[n]][0] for n, key in zip(kept, keys, strict=True) if key in written}


def search_lists(
    session: Session,
    gallery: Gallery,
    row: TrainedModel,
    features: np.ndarray,
    query_points: np.ndarray,
    k: int,
) -> Lists | None:
    """The two lists of a mixed search of an attached pgvector table: the native one searched
    by the model's column, the other by the old vector column among the rows without it; both
    exact. None when no item is re-embedded for the model. 409 when the rows count re-embedded
    items but the table lost their column (its owner dropped it): the old vectors alone would
    answer for items meant to be scored in the new space, unmerged."""
    if reembedded_count(session, gallery.id, row.id) == 0:
        return None
    storage = pgvector_storage(session_settings(session))
    source = storage.source(gallery)
    if pg_migration.shape(storage.settings, source, row.id) is None:
        name = pg_migration.migration_column(row.id)
        raise conflict(
            f"gallery {gallery.id} counts items re-embedded for model {row.id}, but its table "
            f"no longer has their column {name!r}: searching it would mix the spaces without "
            "the merge. Upload the re-embedded items again, or delete the model (cascade) to "
            "search the old vectors alone"
        )
    native = pg_migration.search_vector(storage, gallery, row.id, features, k)
    ids, dist, _ = PgvectorSearcher(storage, gallery).search_with_points(
        query_points, k, lacking=pg_migration.migration_column(row.id)
    )
    return native, (ids, dist)


def forget(settings: Settings, gallery: Gallery, model_ids: list[str]) -> None:
    """Drop the models' columns from the gallery's table (``pg_migration.forget_models``; best
    effort)."""
    source = PgvectorSource.of(gallery.source or {})
    pg_migration.forget_models(settings, gallery.id, source, model_ids)


def read_texts(
    settings: Settings, gallery: Gallery, field: str, items: list[str]
) -> dict[str, str]:
    """Item id → document text, of the items whose row holds one in ``field``."""
    return pg_texts.read_texts(pgvector_storage(settings), gallery, field, items)


def read_vectors(
    settings: Settings, gallery: Gallery, model_id: str, items: list[str]
) -> tuple[list[str], np.ndarray]:
    """(item ids, rows) of the model's column for the items whose row has it."""
    return pg_migration.read_vectors(pgvector_storage(settings), gallery, model_id, items)
