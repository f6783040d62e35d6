"""The SQL rows of stored vectors: a gallery's own vectors (galleries with ``vector_storage``
"sql") and the new backbone's features of re-embedded items (every gallery). They point at a
gallery and a model by id only; storage knows nothing else of either."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Index,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base, BigIntPK, utcnow


class GalleryVector(Base):
    """One stored vector of a gallery stored as SQL rows; its primary key is also its FAISS id."""

    __tablename__ = "gallery_vectors"
    __table_args__ = (UniqueConstraint("gallery_id", "item_id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    gallery_id: Mapped[str] = mapped_column(ForeignKey("galleries.id", ondelete="CASCADE"))
    item_id: Mapped[str] = mapped_column(String(256))
    # float32 little-endian: the Euclidean vector as uploaded (external galleries) or the
    # model's space components (model-bound galleries).
    vector: Mapped[bytes] = mapped_column(LargeBinary)
    label: Mapped[str | None] = mapped_column(Text)
    # none_as_null: an item without metadata is SQL NULL, not the JSON text 'null' (which cost
    # a json.dumps per row: a third of an upload's insert time, measured with bench.perf.profile).
    item_metadata: Mapped[dict[str, Any] | None] = mapped_column(
        "metadata", JSON(none_as_null=True)
    )
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class ReembeddedVector(Base):
    """The new backbone's features of one stored item, as ``model_id`` takes them as input. The
    item's old vector stays where the gallery stores it; deleting or replacing the item deletes
    this row (``app.galleries.service``; the partial backfill of ``app.migration`` writes it), deleting its model or gallery cascades. ``vector_id``
    is the item's internal id in its gallery (no foreign key: segment-stored galleries keep no
    row per vector). A rewrite inserts a new row: on PostgreSQL ``max(id)`` changes with every
    write; SQLite hands a deleted last row's id out again (``app.migration.reembed``'s
    ``reembedded_features``)."""

    __tablename__ = "gallery_reembedded"
    __table_args__ = (
        UniqueConstraint("gallery_id", "model_id", "vector_id"),
        Index("ix_gallery_reembedded_gallery_model", "gallery_id", "model_id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    gallery_id: Mapped[str] = mapped_column(ForeignKey("galleries.id", ondelete="CASCADE"))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    vector_id: Mapped[int] = mapped_column(BigIntPK, index=True)
    # float32 little-endian, as uploaded; None where an attached collection holds them: Qdrant
    # as a named vector of the item's point (``app.migration.in_place``), Milvus in a sibling
    # collection (``app.migration.in_place.milvus``).
    features: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class AttachedPointId(Base):
    """The internal id of one point of an attached collection whose own id cannot serve as one
    (a UUID, or an integer ≥ 2⁶²: ``app.vectors.attached_ids``). Only ids are kept, never a vector:
    the collection stays the one copy of the gallery."""

    __tablename__ = "attached_point_ids"
    __table_args__ = (UniqueConstraint("gallery_id", "point_id"),)

    gallery_id: Mapped[str] = mapped_column(
        ForeignKey("galleries.id", ondelete="CASCADE"), primary_key=True
    )
    vector_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    point_id: Mapped[str] = mapped_column(String(40))
