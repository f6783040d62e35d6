"""Galleries: one embedding space each (its stored vectors are rows of ``app.vectors.tables``
or files and collections the storage engines keep, named by ``vector_storage``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base, utcnow


class Gallery(Base):
    """An external gallery (``model_name``, Euclidean ``dim``, ``metric`` and the fixed lift into
    the Lorentz frame) or a model-bound one (``bound_model_id``, ``modality``; ``dim`` is then the
    model's output dimension and vectors are already space components)."""

    __tablename__ = "galleries"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    dim: Mapped[int]
    model_name: Mapped[str | None] = mapped_column(String(256))
    metric: Mapped[str | None] = mapped_column(String(16))
    lift_curv: Mapped[float]
    lift_scale: Mapped[float | None]
    bound_model_id: Mapped[str | None] = mapped_column(
        ForeignKey("models.id", ondelete="RESTRICT"), index=True
    )
    modality: Mapped[str | None] = mapped_column(String(64))
    index_kind: Mapped[str] = mapped_column(String(16), default="flat")
    index_params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    count: Mapped[int] = mapped_column(default=0)
    # Bumped in the same transaction as every change of the vectors; the persisted index file
    # carries the version it reflects, so a stale file is detected and rebuilt.
    index_version: Mapped[int] = mapped_column(default=0)
    # Where the vectors live: "segments" (append-only files under the data dir, committed by
    # ``vector_manifest``, see app.vectors.faiss.segments) or "sql" (rows of gallery_vectors: every
    # gallery created before segment files existed, or with NOBACKFILL_VECTOR_STORAGE=sql).
    vector_storage: Mapped[str] = mapped_column(String(16), default="sql", server_default="sql")
    vector_manifest: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # vector_storage "qdrant" / "milvus_attached": the attached collection the gallery reads
    # (never writes); its keys are ``app.vectors.qdrant.source.QdrantSource``'s /
    # ``app.vectors.milvus.source.MilvusSource``'s. None for every other gallery.
    source: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class AccessCount(Base):
    """How often users opened or clicked one item of a gallery, as the team's own logs count it
    (``POST /v1/galleries/{id}/access``; ``app.migration.access`` adds to it). One row per item
    that has a count, keyed by the item id the client knows; ``vector_id`` is the item's internal
    id (stable while the item exists), so the backfill plan lines counts up with the gallery's
    points without looking every counted name up. Deleting the item deletes its row
    (``app.galleries.service``), deleting the gallery cascades; replacing an item's vector keeps
    it (the traffic belongs to the item, not to its embedding)."""

    __tablename__ = "gallery_access"

    gallery_id: Mapped[str] = mapped_column(
        ForeignKey("galleries.id", ondelete="CASCADE"), primary_key=True
    )
    item_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    vector_id: Mapped[int] = mapped_column(BigInteger)
    # BigInteger on both databases: counts add up past 2³¹ on a busy gallery.
    count: Mapped[int] = mapped_column(BigInteger)


class ReturnedWeight(Base):
    """The service's own tally of what its searches returned (``app.migration.returned``): per
    item, keyed by internal id, the sum of 1 / rank over the searches that returned it. A weak
    signal of traffic (most returned items are not what the user chose), used by the backfill
    plan only where its validation against the access counts finds it helps. Deleting the item
    deletes its row (``app.galleries.service``), deleting the gallery cascades."""

    __tablename__ = "gallery_returned"

    gallery_id: Mapped[str] = mapped_column(
        ForeignKey("galleries.id", ondelete="CASCADE"), primary_key=True
    )
    vector_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    weight: Mapped[float] = mapped_column(Float)


class AttachedOwner(Base):
    """Which tenant a collection on a shared server belongs to (``app.galleries.attach``): the
    first tenant to attach it, while it keeps a gallery on it; another tenant's attach of the
    same collection is refused unless the server is listed in ``attach_shared_urls``. Embedded
    stores need no row: each tenant has its own folder (``source_rules.tenant_folder``)."""

    __tablename__ = "attached_owners"

    # sha256 of "<engine>\n<place>\n<collection>" (``attach.owner_key``): the place is a URL of
    # up to 2 KiB, too long for a portable key of its own.
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    engine: Mapped[str] = mapped_column(String(16))
    place: Mapped[str] = mapped_column(String(2100))
    collection: Mapped[str] = mapped_column(String(255))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class GalleryText(Base):
    """An item's document text (issue 43, item 2): what a two-stage search sends to the model's
    embedder when the item has no new vector yet. Keyed by the item's internal id; written in
    the same transaction as the item's vector, replaced or removed with it, and gone with the
    gallery (cascade)."""

    __tablename__ = "gallery_texts"

    gallery_id: Mapped[str] = mapped_column(
        ForeignKey("galleries.id", ondelete="CASCADE"), primary_key=True
    )
    vector_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    text: Mapped[str] = mapped_column(Text)
