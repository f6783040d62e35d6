"""Galleries and their vectors: validation, all-or-nothing upserts, and the index kept in step.

Order of a write: validate everything → one transaction (rows, count, ``index_version`` bump) →
commit → patch and save the index. The commit is the acknowledgement; a crash after it leaves an
index file for an older version, which the next start (or the next search) rebuilds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.orm import Session

from app.core.arrays import as_matrix, check_batch_size, check_count, check_ids, check_labels
from app.core.db import new_id, utcnow
from app.core.errors import FieldError, conflict, invalid, invalid_fields, not_found
from app.core.settings import Settings
from app.core.tenancy import check_name_free, check_tenant_limit, get_owned
from app.galleries.attach import attach_gallery, refuse_writes, release
from app.galleries.models import AccessCount, Gallery, GalleryText, ReturnedWeight
from app.galleries.schemas import GalleryCreate
from app.ml.geometry.space import DEFAULT_CURVATURE, DEFAULT_LIFT_SCALE
from app.models.models import TrainedModel
from app.models.service import ModelCache, embed_features, get_model, resolve_modality
from app.vectors.engine import (
    ATTACHED,
    ATTACHED_MILVUS,
    ATTACHED_PGVECTOR,
    MILVUS,
    QDRANT,
    SEARCHED_IN_ENGINE,
    VectorStorage,
)
from app.vectors.faiss.index import LorentzIndex, validate_index_params
from app.vectors.faiss.index_store import IndexSpec, IndexStore
from app.vectors.faiss.segment_format import SegmentCorrupted
from app.vectors.faiss.segments import empty_manifest, segment_storage
from app.vectors.points import lifted_points
from app.vectors.storage import engine_searcher, session_settings, storage_for, vectors_dir
from app.vectors.tables import ReembeddedVector

if TYPE_CHECKING:
    from app.vectors.storage import EngineSearcher

log = logging.getLogger(__name__)
# Bound on the number of SQL parameters in one IN (…) list (SQLite's limit is far above this).
IN_CHUNK = 500


@dataclass(frozen=True)
class VectorBatch:
    """An upsert after parsing (lists from JSON, arrays from ``.npy``), before validation."""

    ids: Sequence[Any]
    matrix: Any
    matrix_field: str
    labels: Sequence[Any] | None
    metadata: Sequence[Any] | None
    texts: Sequence[Any] | None = None


def index_spec(gallery: Gallery) -> IndexSpec:
    return IndexSpec(
        gallery_id=gallery.id,
        version=gallery.index_version,
        dim=gallery.dim,
        curv=gallery.lift_curv,
        kind=gallery.index_kind,
        params=dict(gallery.index_params),
    )


def radius(points: np.ndarray, curv: float) -> np.ndarray:
    norms = np.linalg.norm(points.astype(np.float64), axis=1)
    return np.arcsinh(np.sqrt(curv) * norms) / np.sqrt(curv)


def get_gallery(session: Session, tenant_id: str, gallery_id: str) -> Gallery:
    return get_owned(session, Gallery, tenant_id, gallery_id, "gallery")


def create_gallery(
    session: Session, settings: Settings, tenant_id: str, request: GalleryCreate
) -> Gallery:
    check_tenant_limit(
        session,
        Gallery,
        tenant_id,
        settings.max_galleries_per_tenant,
        "galleries",
        "max_galleries_per_tenant",
    )
    check_name_free(session, Gallery, tenant_id, request.name)
    if request.source is not None:
        return attach_gallery(session, settings, tenant_id, request)
    kind = request.index or settings.default_index_kind
    try:
        params = validate_index_params(kind, request.index_params or {})
    except ValueError as exc:
        raise invalid("index_params", str(exc)) from exc
    # The engine decides for new galleries only: an existing gallery keeps its storage.
    storage = MILVUS if settings.vector_engine == "milvus" else settings.vector_storage
    gallery = Gallery(
        id=new_id("gal"),
        tenant_id=tenant_id,
        name=request.name,
        index_kind=kind,
        index_params=params,
        vector_storage=storage,
        vector_manifest=empty_manifest() if storage == "segments" else None,
    )
    if request.model_id is None:
        if request.dim > settings.max_dim:
            raise invalid("dim", f"exceeds the limit of {settings.max_dim}")
        scale = request.lift_scale or DEFAULT_LIFT_SCALE
        curv = request.curv or DEFAULT_CURVATURE
        if request.metric == "cosine" and scale > settings.max_radius:
            raise invalid(
                "lift_scale", f"lifted vectors would lie beyond radius {settings.max_radius}"
            )
        gallery.dim, gallery.model_name, gallery.metric = (
            request.dim,
            request.model_name,
            request.metric,
        )
        gallery.lift_scale, gallery.lift_curv = scale, curv
    else:
        row = get_model(session, tenant_id, request.model_id)
        gallery.bound_model_id = row.id
        gallery.modality = resolve_modality(row, request.modality)
        gallery.dim, gallery.lift_curv = row.output_dim, row.curv
    session.add(gallery)
    return gallery


def gallery_out(
    session: Session, gallery: Gallery, reembedded: list[dict[str, Any]]
) -> dict[str, Any]:
    """The gallery as the API shows it; ``reembedded`` is its partial-backfill progress
    (``app.migration.progress.progress``), which the caller adds because it lies above this layer."""
    input_dim = None
    if gallery.bound_model_id is not None:
        row = session.get(TrainedModel, gallery.bound_model_id)
        input_dim = int(row.input_dims[gallery.modality]) if row is not None else None
    return {
        "id": gallery.id,
        "name": gallery.name,
        "kind": "external" if gallery.bound_model_id is None else "model",
        "dim": gallery.dim,
        "model_name": gallery.model_name,
        "metric": gallery.metric,
        "lift": (
            None
            if gallery.bound_model_id is not None
            else {"curv": gallery.lift_curv, "scale": gallery.lift_scale, "metric": gallery.metric}
        ),
        "model_id": gallery.bound_model_id,
        "modality": gallery.modality,
        "input_dim": input_dim,
        "index": {"kind": gallery.index_kind, "params": gallery.index_params},
        "count": gallery.count,
        "source": gallery.source,
        "reembedded": reembedded,
        "created_at": gallery.created_at,
        "updated_at": gallery.updated_at,
    }


def point_loader(session: Session, gallery: Gallery, end_transaction: bool = False):
    """Reads every stored vector of ``gallery`` (ids, space components) for an index rebuild.

    ``end_transaction``: commit once the rows are read, before the lift and the index build
    (minutes at a million rows), which must not hold a transaction open: PostgreSQL ends a
    session idle in a transaction past ``pg_idle_in_transaction_timeout_ms``. Only for a caller
    with nothing pending of its own (the startup check)."""

    def load() -> tuple[np.ndarray, np.ndarray]:
        ids: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
        vectors: list[np.ndarray] = [np.zeros((0, gallery.dim), dtype=np.float32)]
        for part in storage_for(session, gallery).scan(session, gallery):
            ids.append(part.ids)
            vectors.append(part.vectors)
        if end_transaction:
            session.commit()
        return np.concatenate(ids), lifted_points(gallery, np.concatenate(vectors))

    return load


def _validate_batch(
    session: Session, settings: Settings, cache: ModelCache, gallery: Gallery, batch: VectorBatch
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(ids, stored vectors, points) of a valid batch; raises 4xx naming the field otherwise."""
    check_batch_size(len(batch.ids), "ids", settings.max_vectors_per_request)
    ids = check_ids(batch.ids, "ids", max_length=settings.max_id_length)
    bound = gallery.bound_model_id is not None
    expected = "features" if bound else "vectors"
    if batch.matrix_field != expected or batch.matrix is None:
        kind = "model-bound (send backbone features)" if bound else "external (send vectors)"
        raise invalid(expected, f"required: this gallery is {kind}")
    check_count(len(batch.matrix), expected, len(ids))
    if bound:
        row = session.get(TrainedModel, gallery.bound_model_id)
        points, _ = embed_features(cache, settings, row, batch.matrix, gallery.modality, expected)
        stored = points
    else:
        stored = as_matrix(batch.matrix, expected, dim=gallery.dim, max_dim=settings.max_dim)
        points = lifted_points(gallery, stored)
    radii = radius(points, gallery.lift_curv)
    too_far = np.nonzero(radii > settings.max_radius)[0]
    if len(too_far):
        raise invalid_fields(
            [
                FieldError(
                    f"{expected}[{i}]",
                    f"lies at hyperbolic radius {radii[i]:.2f} > {settings.max_radius} "
                    "(float32 search is unreliable there; rescale the vectors)",
                )
                for i in too_far[:20].tolist()
            ]
        )
    check_labels(batch.labels, len(ids))
    if batch.metadata is not None:
        check_count(len(batch.metadata), "metadata", len(ids))
        bad = [i for i, m in enumerate(batch.metadata) if m is not None and not isinstance(m, dict)]
        if bad:
            raise invalid_fields(
                [FieldError(f"metadata[{i}]", "must be an object") for i in bad[:20]]
            )
        # JSON has no NaN or Infinity: stored, they would read back as null (data changed).
        odd = [i for i, m in enumerate(batch.metadata) if m is not None and not _finite_json(m)]
        if odd:
            raise invalid_fields(
                [
                    FieldError(f"metadata[{i}]", "NaN and Infinity are not JSON numbers")
                    for i in odd[:20]
                ]
            )
    check_texts(batch.texts, len(ids), settings.max_text_length)
    return ids, stored, points


def _finite_json(value: Any) -> bool:
    """No float in ``value`` (nested lists and objects included) is NaN or ±Infinity."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return True


def check_texts(texts: Sequence[Any] | None, n: int, max_length: int) -> None:
    """422 naming each bad entry: one per id, a string (≤ ``max_length`` characters, no NUL) or
    null."""
    if texts is None:
        return
    check_count(len(texts), "texts", n)
    errors = []
    for i, text in enumerate(texts):
        if text is None:
            continue
        if not isinstance(text, str):
            errors.append(FieldError(f"texts[{i}]", "must be a string or null"))
        elif len(text) > max_length:
            errors.append(
                FieldError(f"texts[{i}]", f"longer than {max_length} characters (MAX_TEXT_LENGTH)")
            )
        elif "\x00" in text:
            errors.append(FieldError(f"texts[{i}]", "NUL characters are not allowed"))
        if len(errors) >= 20:
            break
    if errors:
        raise invalid_fields(errors)


def _write_texts(
    session: Session, gallery: Gallery, vector_ids: np.ndarray, texts: Sequence[Any] | None
) -> None:
    """An upserted item's text replaces whatever text it had (none given: none kept): a new
    vector is new content."""
    _delete_rows(session, GalleryText, gallery, GalleryText.vector_id, vector_ids.tolist())
    if texts is None:
        return
    rows = [
        {"gallery_id": gallery.id, "vector_id": int(v), "text": t}
        for v, t in zip(vector_ids.tolist(), texts, strict=True)
        if t is not None
    ]
    if rows:
        session.execute(insert(GalleryText), rows)


def item_texts(session: Session, gallery_id: str, vector_ids: Sequence[int]) -> dict[int, str]:
    """The stored texts of these items (those that have one)."""
    out: dict[int, str] = {}
    wanted = [int(v) for v in vector_ids]
    for start in range(0, len(wanted), IN_CHUNK):
        rows = session.execute(
            select(GalleryText.vector_id, GalleryText.text).where(
                GalleryText.gallery_id == gallery_id,
                GalleryText.vector_id.in_(wanted[start : start + IN_CHUNK]),
            )
        )
        out.update({int(v): t for v, t in rows})
    return out


def _delete_rows(session: Session, table: Any, gallery: Gallery, column: Any, values: list) -> None:
    """Delete the gallery's rows of ``table`` whose ``column`` is among ``values`` (in chunks:
    an IN list has a bound-parameter limit)."""
    for start in range(0, len(values), IN_CHUNK):
        session.execute(
            delete(table).where(
                table.gallery_id == gallery.id, column.in_(values[start : start + IN_CHUNK])
            )
        )


def _forget_reembedded(session: Session, gallery: Gallery, vector_ids: np.ndarray) -> None:
    """Features re-embedded from items that were replaced or deleted are stale: drop them."""
    _delete_rows(
        session, ReembeddedVector, gallery, ReembeddedVector.vector_id, vector_ids.tolist()
    )


def _forget_access(session: Session, gallery: Gallery, item_ids: list[str]) -> None:
    """A deleted item's access counts go with it (an upload of counts checks its ids under the
    gallery's lock, so none can land between this delete and its commit)."""
    _delete_rows(session, AccessCount, gallery, AccessCount.item_id, item_ids)


def _forget_returned(session: Session, gallery: Gallery, vector_ids: np.ndarray) -> None:
    """A deleted item's search-returned tally goes with it (its internal id could otherwise be
    counted for an item that takes the id later)."""
    _delete_rows(session, ReturnedWeight, gallery, ReturnedWeight.vector_id, vector_ids.tolist())


def _lock_gallery(session: Session, gallery: Gallery) -> Gallery:
    """Re-read the gallery row under a row lock (PostgreSQL; SQLite serialises writers). The
    row is read afresh (populate_existing), not taken from the identity map: a writer that waited
    for the lock must see the count, version and segment manifest the previous writer committed
    (appending at a stale segment end would overwrite committed batches).

    SQLite has no row locks and begins a transaction only at its first write: a no-op UPDATE
    takes the database's write lock first, so writers in other processes wait here too."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(
            update(Gallery)
            .where(Gallery.id == gallery.id)
            .values(index_version=Gallery.index_version, updated_at=Gallery.updated_at)
            .execution_options(synchronize_session=False)
        )
    locked = session.scalar(
        select(Gallery)
        .where(Gallery.id == gallery.id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if locked is None:
        raise not_found("gallery", gallery.id)
    return locked


def _refresh_index(
    session: Session,
    store: IndexStore,
    gallery: Gallery,
    previous_version: int,
    **changes: np.ndarray,
) -> None:
    """Bring the index to the committed version; the data is already durable, so a failure here
    only logs and leaves the index to be rebuilt on next use. A Milvus gallery has no index in
    this process: Milvus indexes its own writes."""
    if gallery.vector_storage in SEARCHED_IN_ENGINE:
        return
    try:
        store.apply(
            index_spec(gallery), previous_version, point_loader(session, gallery), **changes
        )
    except Exception:
        log.exception("index update for gallery %s failed; it will be rebuilt", gallery.id)
        store.forget(gallery.id)


def _counted(session: Session, storage: VectorStorage, gallery: Gallery, counted: int) -> int:
    """The gallery's count after a write. Milvus has the write before the SQL commit, and a
    failed commit would keep the old count beside the new rows: its count is read back from
    Milvus (under the gallery's lock) instead of being carried forward."""
    return storage.count(session, gallery) if storage.name == MILVUS else counted


def upsert_vectors(
    session: Session,
    settings: Settings,
    store: IndexStore,
    cache: ModelCache,
    gallery: Gallery,
    batch: VectorBatch,
) -> tuple[int, int]:
    refuse_writes(gallery)
    ids, stored, points = _validate_batch(session, settings, cache, gallery, batch)
    labels = list(batch.labels) if batch.labels is not None else [None] * len(ids)
    metadata = list(batch.metadata) if batch.metadata is not None else [None] * len(ids)
    with store.lock(gallery.id):
        gallery = _lock_gallery(session, gallery)
        previous_version = gallery.index_version
        storage = storage_for(session, gallery)
        written = storage.upsert(session, gallery, ids, stored, labels, metadata)
        # A replaced item is new content: features re-embedded from the old one are stale.
        _forget_reembedded(session, gallery, written.replaced)
        _write_texts(session, gallery, np.asarray(written.ids), batch.texts)
        gallery.count = _counted(session, storage, gallery, gallery.count + written.inserted)
        gallery.index_version += 1
        gallery.updated_at = utcnow()
        session.commit()
        _refresh_index(
            session, store, gallery, previous_version, upsert_ids=written.ids, upsert_points=points
        )
    return len(ids), gallery.count


def delete_vectors(
    session: Session,
    settings: Settings,
    store: IndexStore,
    gallery: Gallery,
    ids: Sequence[Any],
    missing_ok: bool,
) -> tuple[int, int]:
    refuse_writes(gallery)
    check_batch_size(len(ids), "ids", settings.max_vectors_per_request)
    ids = check_ids(ids, "ids", max_length=settings.max_id_length)
    with store.lock(gallery.id):
        gallery = _lock_gallery(session, gallery)
        storage = storage_for(session, gallery)
        existing = storage.lookup(session, gallery, ids)
        missing = [n for n, i in enumerate(ids) if i not in existing]
        if missing and not missing_ok:
            raise invalid_fields(
                [FieldError(f"ids[{n}]", "not in this gallery") for n in missing[:20]]
            )
        if not existing:
            return 0, gallery.count
        previous_version = gallery.index_version
        removed = storage.delete(session, gallery, ids)
        _forget_reembedded(session, gallery, removed)
        _delete_rows(session, GalleryText, gallery, GalleryText.vector_id, removed.tolist())
        _forget_access(session, gallery, list(existing))
        _forget_returned(session, gallery, removed)
        gallery.count = _counted(session, storage, gallery, gallery.count - len(removed))
        gallery.index_version += 1
        gallery.updated_at = utcnow()
        session.commit()
        _refresh_index(session, store, gallery, previous_version, remove_ids=removed)
    return len(removed), gallery.count


def refuse_while_bound(session: Session, model_id: str) -> None:
    """409 while galleries hold vectors embedded by model ``model_id`` (before deleting it)."""
    galleries = list(session.scalars(select(Gallery.id).where(Gallery.bound_model_id == model_id)))
    if galleries:
        raise conflict(
            f"galleries {sorted(galleries)} hold vectors embedded by model {model_id}; "
            "delete them first"
        )


def reembedded_by_model(session: Session, gallery_id: str) -> dict[str, int]:
    """Items of the gallery re-embedded, per model (acknowledged uploads a delete would drop)."""
    rows = session.execute(
        select(ReembeddedVector.model_id, func.count())
        .where(ReembeddedVector.gallery_id == gallery_id)
        .group_by(ReembeddedVector.model_id)
        .order_by(ReembeddedVector.model_id)
    )
    return {model_id: int(count) for model_id, count in rows}


def delete_gallery(
    session: Session, store: IndexStore, gallery: Gallery, cascade: bool = False
) -> dict[str, Any]:
    """Deletes the gallery and everything stored for it; 409 while an upgrade trains on it, and
    while it holds re-embedded items unless ``cascade`` (then they go too); returns what was
    cascaded. (The datasets that pair their items with it are checked first by the caller,
    ``app.datasets.service.refuse_while_paired``: datasets lie above galleries.)"""
    from app.jobs.models import QUEUED, RUNNING, UpgradeJob

    active = list(
        session.scalars(
            select(UpgradeJob.id).where(
                UpgradeJob.gallery_id == gallery.id, UpgradeJob.status.in_((QUEUED, RUNNING))
            )
        )
    )
    if active:
        raise conflict(f"upgrades {active} are training against this gallery; cancel them first")
    reembedded = reembedded_by_model(session, gallery.id)
    if reembedded and not cascade:
        listed = ", ".join(f"{model_id}: {n}" for model_id, n in reembedded.items())
        raise conflict(
            f"the gallery holds {sum(reembedded.values())} items re-embedded by new models "
            f"({listed}); deleting it would delete them: repeat with ?cascade=true to delete "
            "them with it"
        )
    kind, attached, tenant_id = (
        gallery.vector_storage,
        dict(gallery.source or {}),
        gallery.tenant_id,
    )
    with store.lock(gallery.id):
        storage = storage_for(session, gallery)
        session.delete(gallery)
        session.commit()
        storage.drop(gallery.id)
        store.drop(gallery.id)
    if kind in ATTACHED:
        release(session, tenant_id, attached)
        session.commit()
    if reembedded:
        # The service's writes to the owner's collection (an in-place migration) go too.
        _forget_in_collection(session, gallery.id, kind, attached, reembedded)
    return {"reembedded_items": sum(reembedded.values()), "by_model": reembedded}


def _forget_in_collection(
    session: Session, gallery_id: str, kind: str, source: dict[str, Any], model_ids: list[str]
) -> None:
    settings = session_settings(session)
    if kind == QDRANT:
        from app.vectors.qdrant import named as qdrant_named
        from app.vectors.qdrant.source import QdrantSource

        qdrant_named.forget_models(settings, gallery_id, QdrantSource.of(source), model_ids)
    elif kind == ATTACHED_MILVUS:
        from app.vectors.milvus import sibling as milvus_sibling
        from app.vectors.milvus.source import MilvusSource

        milvus_sibling.forget_models(settings, gallery_id, MilvusSource.of(source), model_ids)
    elif kind == ATTACHED_PGVECTOR:
        from app.vectors.pgvector import migration as pgvector_migration
        from app.vectors.pgvector.source import PgvectorSource

        pgvector_migration.forget_models(settings, gallery_id, PgvectorSource.of(source), model_ids)


def index_for(
    session: Session, store: IndexStore, gallery: Gallery
) -> LorentzIndex | EngineSearcher:
    """What searches the gallery: its in-memory FAISS index, or for a Milvus gallery a
    ``MilvusSearcher`` (same ``ntotal`` and ``search_with_points``) that holds nothing, and
    for an attached Qdrant or Milvus collection or pgvector table a ``QdrantSearcher``, a
    ``MilvusAttachedSearcher`` or a ``PgvectorSearcher`` (``engine_searcher``)."""
    searcher = engine_searcher(session, gallery)
    if searcher is not None:
        return searcher
    index = store.get(index_spec(gallery), point_loader(session, gallery))
    in_memory = store.current_version(gallery.id)
    if in_memory is not None and in_memory > gallery.index_version:
        # A write committed after this request read the gallery, and the index holds it: read
        # the row again, so that what is looked up beside the index (the items' names through
        # the manifest) is at least as new as the index.
        fresh = session.scalar(
            select(Gallery)
            .where(Gallery.id == gallery.id)
            .execution_options(populate_existing=True)
        )
        if fresh is None:
            # Deleted meanwhile (by another process): answered as if the request came later.
            raise not_found("gallery", gallery.id)
    return index


def gallery_points(
    session: Session, store: IndexStore, gallery: Gallery
) -> tuple[np.ndarray, np.ndarray]:
    """(internal ids ascending, space components) of every stored item: from the in-memory
    index, or read from Milvus or Qdrant for this call only."""
    if gallery.vector_storage in SEARCHED_IN_ENGINE:
        ids, points = point_loader(session, gallery)()
        # Qdrant's and Milvus's pages follow their own order, not the mapped ids'.
        order = np.argsort(ids, kind="stable")
        return ids[order], points[order]
    index = index_for(session, store, gallery)
    return index.ids, index.lifted[:, 1:]


def verify_all_indexes(session: Session, store: IndexStore) -> dict[str, str]:
    """Startup consistency check: every gallery's index file must hold exactly its stored ids."""
    outcome: dict[str, str] = {}
    galleries = list(session.scalars(select(Gallery)))
    store.remove_orphans({g.id for g in galleries})
    segment_storage(vectors_dir(session)).recover(
        [g for g in galleries if g.vector_storage == "segments"]
    )
    for gallery in galleries:
        if gallery.vector_storage in ATTACHED:
            _recount_attached(session, gallery)
            continue
        if gallery.vector_storage == MILVUS:
            # No index here; Milvus's count(*) repairs a count a failed commit left behind.
            _repair_count(session, gallery, storage_for(session, gallery).count(session, gallery))
            continue
        try:
            stored_ids = storage_for(session, gallery).all_ids(session, gallery)
        except SegmentCorrupted as exc:
            # Reported, never read as data: every use of the gallery fails until it is repaired.
            log.error("startup check: vectors of gallery %s are damaged: %s", gallery.id, exc)
            outcome[gallery.id] = f"corrupt: {exc}"
            continue
        _repair_count(session, gallery, len(stored_ids))
        spec = index_spec(gallery)
        # The repair is written and the read transaction ended before a rebuild's long compute.
        session.commit()
        outcome[gallery.id] = store.verify(
            spec, stored_ids, point_loader(session, gallery, end_transaction=True)
        )
    return outcome


def _recount_attached(session: Session, gallery: Gallery) -> None:
    """An attached collection changes under the service: its count is read again at start; a
    collection out of reach must not stop the start (its searches answer 503 meanwhile)."""
    try:
        points = storage_for(session, gallery).count(session, gallery)
    except Exception as exc:
        log.warning("startup check: attached gallery %s is out of reach: %s", gallery.id, exc)
        return
    _repair_count(session, gallery, points)


def _repair_count(session: Session, gallery: Gallery, stored: int) -> None:
    if stored != gallery.count:
        log.warning(
            "startup check: gallery %s counted %d vectors, stores %d; count repaired",
            gallery.id,
            gallery.count,
            stored,
        )
        gallery.count = stored
        session.commit()


def read_vectors(
    session: Session, settings: Settings, gallery: Gallery, ids: Sequence[Any]
) -> tuple[list[str], np.ndarray, list[str | None], list[dict[str, Any] | None]]:
    """The stored rows of ``ids``, in their order: (ids, N×dim float32 vectors as stored, labels,
    metadata). Ids the gallery does not hold are a 404 naming each."""
    check_batch_size(len(ids), "ids", settings.max_vectors_per_request)
    ids = check_ids(ids, "ids", max_length=settings.max_id_length)
    found = storage_for(session, gallery).fetch(session, gallery, ids)
    if len(found) < len(ids):
        present = set(found.item_ids)
        missing = [n for n, item_id in enumerate(ids) if item_id not in present]
        raise invalid_fields(
            [FieldError(f"ids[{n}]", f"{ids[n]!r} is not in this gallery") for n in missing[:20]],
            status=404,
        )
    return ids, found.vectors, found.labels, found.metadata
