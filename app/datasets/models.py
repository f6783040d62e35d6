"""Datasets: new-backbone features (per modality) for training upgrades."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base, BigIntPK, utcnow


class Dataset(Base):
    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    # With a gallery, item ids are gallery item ids and the old embeddings come from there.
    gallery_id: Mapped[str | None] = mapped_column(
        ForeignKey("galleries.id", ondelete="RESTRICT"), index=True
    )
    modalities: Mapped[list[str]] = mapped_column(JSON)
    # Feature dimension per modality, fixed by the first upload.
    dims: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    count: Mapped[int] = mapped_column(default=0)
    # The query log's size, kept beside ``count`` so listing datasets needs no aggregate.
    query_count: Mapped[int] = mapped_column(default=0, server_default="0")
    queries_with_old_vectors: Mapped[int] = mapped_column(default=0, server_default="0")
    queries_with_relevance: Mapped[int] = mapped_column(default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DatasetItem(Base):
    __tablename__ = "dataset_items"
    __table_args__ = (UniqueConstraint("dataset_id", "modality", "item_id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    item_id: Mapped[str] = mapped_column(String(256))
    modality: Mapped[str] = mapped_column(String(64))
    features: Mapped[bytes] = mapped_column(LargeBinary)  # float32 little-endian
    label: Mapped[str | None] = mapped_column(Text)


class DatasetQuery(Base):
    """One logged query: its new-backbone features (the dataset's first modality), optionally the
    same query embedded by the old model, optionally the gallery items it is about."""

    __tablename__ = "dataset_queries"
    __table_args__ = (UniqueConstraint("dataset_id", "query_id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    query_id: Mapped[str] = mapped_column(String(256))
    features: Mapped[bytes] = mapped_column(LargeBinary)  # float32 little-endian
    old_vector: Mapped[bytes | None] = mapped_column(LargeBinary)  # float32, the gallery's dim
    # Gallery item ids; None when the query carries no relevance.
    relevant_ids: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True))
