"""Attaching a Qdrant or Milvus collection or a pgvector table as a gallery: checked, described,
its ids mapped; no vector copied. The gallery then reads the collection through
``app.vectors.qdrant.storage``, ``app.vectors.milvus.attached`` or
``app.vectors.pgvector.storage`` like any storage, and refuses writes (``refuse_writes``): the
collection belongs to its owner. pymilvus is an optional dependency: the Milvus modules load
only when a Milvus collection is attached or read."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.auth.models import Tenant
from app.core.db import new_id
from app.core.errors import Problem, invalid
from app.core.settings import Settings
from app.galleries.models import AttachedOwner, Gallery
from app.galleries.schemas import GalleryCreate, MilvusSourceIn, PgvectorSourceIn
from app.ml.geometry.space import DEFAULT_CURVATURE, DEFAULT_LIFT_SCALE
from app.vectors import attached_ids
from app.vectors.engine import ATTACHED, ATTACHED_MILVUS, ATTACHED_PGVECTOR, QDRANT
from app.vectors.faiss.index import validate_index_params
from app.vectors.qdrant.source import QdrantSource, describe
from app.vectors.qdrant.storage import qdrant_storage, read_only
from app.vectors.qdrant.texts import check_text_field
from app.vectors.source_rules import (
    dsn_allowed,
    normalized_url,
    owner_key,
    server_collection,
    tenant_folder,
    url_allowed,
)

# The id map's column (``attached_point_ids.point_id``) holds item ids of this length at most.
MAX_MAPPED_ID = 40


def refuse_writes(gallery: Gallery) -> None:
    """409 for an item upload or delete on an attached gallery, before anything is read."""
    if gallery.vector_storage == QDRANT:
        raise read_only(gallery.id)
    if gallery.vector_storage == ATTACHED_MILVUS:
        from app.vectors.milvus.attached import read_only as milvus_read_only

        raise milvus_read_only(gallery.id)
    if gallery.vector_storage == ATTACHED_PGVECTOR:
        from app.vectors.pgvector.storage import read_only as pgvector_read_only

        raise pgvector_read_only(gallery.id)


def attach_gallery(
    session: Session, settings: Settings, tenant_id: str, request: GalleryCreate
) -> Gallery:
    """The gallery row of an attached collection (staged; the caller commits), after the checks
    of the engine's ``describe`` (reachable, collection, fields, Cosine) and the service's own
    limits."""
    assert request.source is not None
    if isinstance(request.source, MilvusSourceIn):
        return _attach_milvus(session, settings, tenant_id, request, request.source)
    if isinstance(request.source, PgvectorSourceIn):
        return _attach_pgvector(session, settings, tenant_id, request, request.source)
    given = request.source
    if given.path is not None and settings.job_runner == "celery":
        # Local mode locks its folder to one process: the worker could never open it.
        raise invalid(
            "source.path",
            "an embedded Qdrant folder opens in one process only, and this service trains in "
            "Celery workers: attach a Qdrant server (url) instead",
        )
    source = QdrantSource(
        collection=given.collection,
        url=None if given.url is None else _normalized(given.url, "source.url"),
        path=given.path,
        vector=given.vector,
        api_key_env=given.api_key_env,
        folder=None if given.path is None else _folder(session, tenant_id),
        text_field=given.text_field,
    )
    claim = _claim(session, settings, tenant_id, source.as_dict())
    shape = describe(settings, source)
    check_text_field(settings, source)
    gallery = _gallery(session, settings, tenant_id, request, shape.dim, shape.count)
    gallery.vector_storage, gallery.source = QDRANT, source.as_dict()
    if claim is not None:
        session.add(claim)
    session.flush()
    pages = qdrant_storage(settings).scroll_ids(gallery)
    _record_ids(session, gallery, ([item.id for item in page] for page in pages))
    return gallery


def _attach_milvus(
    session: Session,
    settings: Settings,
    tenant_id: str,
    request: GalleryCreate,
    given: MilvusSourceIn,
) -> Gallery:
    from app.vectors.milvus.attached import milvus_attached_storage
    from app.vectors.milvus.engine import is_remote
    from app.vectors.milvus.source import MilvusSource
    from app.vectors.milvus.source import describe as describe_milvus
    from app.vectors.milvus.texts import check_text_field as check_milvus_text_field

    remote = is_remote(given.uri)
    if not remote and settings.job_runner == "celery":
        # milvus-lite locks its file to one process: the worker could never open it.
        raise invalid(
            "source.uri",
            "a milvus-lite file opens in one process only, and this service trains in Celery "
            "workers: attach a Milvus server (http(s)://…) instead",
        )
    source = MilvusSource(
        uri=_normalized(given.uri, "source.uri") if remote else given.uri,
        collection=given.collection,
        id_field=given.id_field,
        vector_field=given.vector_field,
        metric=given.metric,
        token_env=given.token_env,
        folder=None if remote else _folder(session, tenant_id),
        text_field=given.text_field,
    )
    claim = _claim(session, settings, tenant_id, source.as_dict())
    shape = describe_milvus(settings, source)
    check_milvus_text_field(settings, source)
    source = MilvusSource.of({**source.as_dict(), "id_type": shape.id_type})
    gallery = _gallery(session, settings, tenant_id, request, shape.dim, shape.count)
    gallery.vector_storage, gallery.source = ATTACHED_MILVUS, source.as_dict()
    if claim is not None:
        session.add(claim)
    session.flush()
    keys = milvus_attached_storage(settings).mapped_keys(gallery)
    _record_ids(session, gallery, keys, count=None if source.string_ids else shape.count)
    return gallery


def _attach_pgvector(
    session: Session,
    settings: Settings,
    tenant_id: str,
    request: GalleryCreate,
    given: PgvectorSourceIn,
) -> Gallery:
    """A pgvector table's gallery: the DSN allowed, the owner claim taken before the database is
    contacted, then the table's shape checked (``describe``) and its ids mapped."""
    from app.vectors.pgvector.source import PgvectorSource, allowed_dsn
    from app.vectors.pgvector.source import describe as describe_pgvector
    from app.vectors.pgvector.storage import pgvector_storage

    source = PgvectorSource(
        dsn=given.dsn,
        # Schema-qualified: one table has one spelling in the owners' table (``_claim``).
        table=given.table if "." in given.table else f"public.{given.table}",
        id_column=given.id_column,
        vector_column=given.vector_column,
        distance=given.distance,
        password_env=given.password_env,
        text_field=given.text_field,
        migration_hnsw=given.migration_hnsw,
        search=given.search,
        ef_search=given.ef_search,
    )
    allowed_dsn(settings, source.dsn)
    claim = _claim(session, settings, tenant_id, source.as_dict())
    shape = describe_pgvector(settings, source)
    source = PgvectorSource.of(
        {
            **source.as_dict(),
            "id_type": shape.id_type,
            "column_type": shape.column_type,
            "pgvector_version": shape.pgvector_version,
        }
    )
    gallery = _gallery(session, settings, tenant_id, request, shape.dim, shape.count)
    gallery.vector_storage, gallery.source = ATTACHED_PGVECTOR, source.as_dict()
    if claim is not None:
        session.add(claim)
    session.flush()
    keys = pgvector_storage(settings).mapped_keys(gallery)
    _record_ids(session, gallery, keys, count=None if source.string_ids else shape.count)
    return gallery


def _folder(session: Session, tenant_id: str) -> str:
    """The tenant's own folder under the attach roots (``source_rules.tenant_folder``)."""
    tenant = session.get(Tenant, tenant_id)
    assert tenant is not None
    return tenant_folder(tenant.id, tenant.name)


def _normalized(url: str, field: str) -> str:
    """The URL the service checks and connects to (``source_rules.normalized_url``); 422 on a
    spelling no allowlist entry vouches for."""
    normal = normalized_url(url)
    if normal is None and url.lower().startswith(("http://", "https://")):
        raise invalid(
            field,
            "not a plain server URL: no credentials, query, fragment, backslash, whitespace or "
            "doubly encoded path",
        )
    return normal or url


def _claim(
    session: Session, settings: Settings, tenant_id: str, source: dict[str, Any]
) -> AttachedOwner | None:
    """Before the service opens a collection on a server for ``tenant_id``: 403 when another
    tenant attached it (unless its server is listed in ``attach_shared_urls``). Checked before
    the server is contacted: a refused tenant learns nothing of the collection. Returns the
    owner row to stage once the attach succeeds (None: already the tenant's, shared, or not on
    a server); two tenants staging one at once meet the primary key, and the later commit
    answers 409 (retry: then this 403)."""
    found = server_collection(source)
    if found is None:
        return None
    if found[0] == "pgvector":
        if dsn_allowed(settings.attach_shared_urls, str(source.get("dsn"))):
            return None
    elif url_allowed(settings.attach_shared_urls, source.get("url") or source.get("uri") or ""):
        return None
    key = owner_key(*found)
    owner = session.get(AttachedOwner, key)
    if owner is None:
        engine, place, collection = found
        return AttachedOwner(
            key=key, engine=engine, place=place, collection=collection, tenant_id=tenant_id
        )
    if owner.tenant_id != tenant_id:
        raise Problem(
            403,
            "Attached by another tenant",
            f"collection {found[2]!r} on this server is attached by another tenant of this "
            "service; a collection on a server belongs to one tenant unless the operator lists "
            "the server in NOBACKFILL_ATTACH_SHARED_URLS",
            slug="attached-by-another-tenant",
        )
    return None


def release(session: Session, tenant_id: str, source: dict[str, Any] | None) -> None:
    """After a tenant's attached gallery was deleted (committed): its claim on the collection
    goes when no other gallery of the tenant reads it (staged; the caller commits)."""
    found = server_collection(source or {})
    if found is None:
        return
    key = owner_key(*found)
    others = session.scalars(
        select(Gallery.source).where(
            Gallery.tenant_id == tenant_id, Gallery.vector_storage.in_(ATTACHED)
        )
    )
    if any(
        (other_found := server_collection(other or {})) and owner_key(*other_found) == key
        for other in others
    ):
        return
    session.execute(
        delete(AttachedOwner).where(AttachedOwner.key == key, AttachedOwner.tenant_id == tenant_id)
    )


def _gallery(
    session: Session,
    settings: Settings,
    tenant_id: str,
    request: GalleryCreate,
    dim: int,
    count: int,
) -> Gallery:
    """The attached gallery's row, its space checked against the service's limits (staged)."""
    if dim > settings.max_dim:
        raise invalid("source.collection", f"its dimension {dim} exceeds {settings.max_dim}")
    scale = request.lift_scale or DEFAULT_LIFT_SCALE
    if scale > settings.max_radius:
        raise invalid("lift_scale", f"lifted vectors would lie beyond radius {settings.max_radius}")
    kind = request.index or settings.default_index_kind
    try:
        params = validate_index_params(kind, request.index_params or {})
    except ValueError as exc:
        raise invalid("index_params", str(exc)) from exc
    gallery = Gallery(
        id=new_id("gal"),
        tenant_id=tenant_id,
        name=request.name,
        dim=dim,
        model_name=request.model_name,
        metric="cosine",
        lift_scale=scale,
        lift_curv=request.curv or DEFAULT_CURVATURE,
        # The index kind only says exact (flat) or the collection's own index (anything else).
        index_kind=kind,
        index_params=params,
        count=count,
    )
    session.add(gallery)
    return gallery


def _record_ids(
    session: Session,
    gallery: Gallery,
    pages: Iterable[list[attached_ids.PointId]],
    count: int | None = None,
) -> None:
    """Map the collection's ids (``attached_ids.record``) and count them; ``count``: the
    collection's own count, when ``pages`` hold only the ids that need a map."""
    points = [point for page in pages for point in page]
    long = next((p for p in points if len(attached_ids.item_id(p)) > MAX_MAPPED_ID), None)
    if long is not None:
        raise invalid(
            "source.collection",
            f"id {attached_ids.item_id(long)[:60]!r} is longer than {MAX_MAPPED_ID} characters, "
            "the longest item id an attached gallery maps",
        )
    attached_ids.record(session, gallery.id, points)
    gallery.count = len(points) if count is None else count


class CollectionChanged(ValueError):
    """The attached collection can no longer serve its gallery as recorded (gone, another
    dimension or metric): a job on it fails saying so, and nothing is written."""


def recheck(session: Session, settings: Settings, gallery: Gallery) -> dict[str, Any] | None:
    """Compare an attached collection with what its gallery recorded, at the start of each job
    on it (its owner changes it at any time). Another dimension, a metric other than Cosine or a
    missing collection or vector raise ``CollectionChanged``; another point count is taken as
    the gallery's (staged; the caller commits) and returned for the job's report:
    ``{"points_recorded", "points_now", "changed"}``. None for a gallery that is not attached.
    A collection out of reach raises the 503 ``Problem`` (the job fails, it may be retried)."""
    if gallery.vector_storage not in ATTACHED:
        return None
    try:
        if gallery.vector_storage == QDRANT:
            shape = describe(settings, QdrantSource.of(gallery.source or {}))
        elif gallery.vector_storage == ATTACHED_PGVECTOR:
            from app.vectors.pgvector.source import PgvectorSource
            from app.vectors.pgvector.source import describe as describe_pgvector

            shape = describe_pgvector(settings, PgvectorSource.of(gallery.source or {}))
        else:
            from app.vectors.milvus.source import MilvusSource
            from app.vectors.milvus.source import describe as describe_milvus

            shape = describe_milvus(settings, MilvusSource.of(gallery.source or {}))
    except Problem as exc:
        if exc.status >= 500:
            raise
        raise CollectionChanged(
            f"the attached collection changed under the service: {exc.detail}"
        ) from exc
    if shape.dim != gallery.dim:
        raise CollectionChanged(
            f"the attached collection changed under the service: its vectors have dimension "
            f"{shape.dim}, the gallery's {gallery.dim}; attach it again as a new gallery"
        )
    recorded = gallery.count
    gallery.count = shape.count
    return {
        "points_recorded": recorded,
        "points_now": shape.count,
        "changed": recorded != shape.count,
    }
