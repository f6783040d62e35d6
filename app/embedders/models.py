"""An embedder a tenant registered: the new backbone's endpoint (issue 43, item 1)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base, utcnow


class Embedder(Base):
    """``url`` speaks the OpenAI-compatible embeddings protocol; ``api_key_env`` names the server
    environment variable that holds its key (never the key itself)."""

    __tablename__ = "embedders"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    url: Mapped[str] = mapped_column(String(2048))
    model: Mapped[str] = mapped_column(String(256))
    dimension: Mapped[int]
    api_key_env: Mapped[str | None] = mapped_column(String(128))
    query_prefix: Mapped[str] = mapped_column(String(256), default="")
    document_prefix: Mapped[str] = mapped_column(String(256), default="")
    max_batch: Mapped[int] = mapped_column(default=64)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
