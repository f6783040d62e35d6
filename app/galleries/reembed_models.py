"""Re-embedded items of a gallery (a new backbone's features per item and model) and the
per-model backfill fit (the planner and the reference documents of the mixed search)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, LargeBinary, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base, BigIntPK, utcnow


class ReembeddedVector(Base):
    """The new backbone's features of one stored item, as ``model_id`` takes them as input. The
    item's old vector stays where the gallery stores it; deleting or replacing the item deletes
    this row (``app.galleries.service``), deleting its model or gallery cascades. ``vector_id``
    is the item's internal id in its gallery (no foreign key: segment-stored galleries keep no
    row per vector). A rewrite inserts a new row, so ``max(id)`` changes with every write."""

    __tablename__ = "gallery_reembedded"
    __table_args__ = (
        UniqueConstraint("gallery_id", "model_id", "vector_id"),
        Index("ix_gallery_reembedded_gallery_model", "gallery_id", "model_id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    gallery_id: Mapped[str] = mapped_column(ForeignKey("galleries.id", ondelete="CASCADE"))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    vector_id: Mapped[int] = mapped_column(BigIntPK, index=True)
    features: Mapped[bytes] = mapped_column(LargeBinary)  # float32 little-endian, as uploaded
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class BackfillFit(Base):
    """Fitted once per model from its upgrade's held-out data: the planner (``fit``, JSON) and
    the reference documents (``reference``: an .npz of their new features and old vectors)."""

    __tablename__ = "backfill_fits"

    model_id: Mapped[str] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    fit: Mapped[dict[str, Any]] = mapped_column(JSON)
    reference: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
