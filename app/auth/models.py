"""Tenants and their API keys (stored as SHA-256 digests, never in clear)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String, false
from sqlalchemy.orm import Mapped, mapped_column

from app.core.db import Base, utcnow


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    # Keys carry 256 random bits, so a plain SHA-256 digest is as strong as a slow hash here.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The first characters, to tell keys apart in listings without revealing them.
    prefix: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128), default="")
    # Admin keys also manage the tenant's keys (/v1/keys). A row written without the flag (an
    # older process during a rolling upgrade) gets the least privilege: the server default.
    admin: Mapped[bool] = mapped_column(default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
