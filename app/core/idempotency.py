"""Idempotency-Key on creating POSTs: the first response is stored with the resource (same
transaction) and replayed for a retry with the same key and body; another body → 422."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi.responses import JSONResponse
from sqlalchemy import JSON, ForeignKey, String, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from app.core.db import Base, utcnow
from app.core.errors import Problem, invalid

MAX_KEY_LENGTH = 255


class IdempotencyRecord(Base):
    __tablename__ = "idempotency_records"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(MAX_KEY_LENGTH), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int]
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    location: Mapped[str | None] = mapped_column(String(512))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


@dataclass(frozen=True)
class IdempotencyRequest:
    """The key sent by the client and what identifies its request (method, path, body)."""

    key: str
    fingerprint: str

    @classmethod
    def from_parts(
        cls, key: str | None, method: str, path: str, body: bytes
    ) -> IdempotencyRequest | None:
        if key is None:
            return None
        if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
            raise invalid("Idempotency-Key", f"must be 1–{MAX_KEY_LENGTH} printable characters")
        digest = hashlib.sha256(f"{method} {path}\n".encode() + body).hexdigest()
        return cls(key=key, fingerprint=digest)


@dataclass(frozen=True)
class StoredResponse:
    status_code: int
    body: dict[str, Any]
    location: str | None


def find_replay(
    session: Session, tenant_id: str, request: IdempotencyRequest | None
) -> StoredResponse | None:
    """The stored response for a retried request, ``None`` for a new key."""
    if request is None:
        return None
    record = session.scalar(
        select(IdempotencyRecord).where(
            IdempotencyRecord.tenant_id == tenant_id, IdempotencyRecord.key == request.key
        )
    )
    if record is None:
        return None
    if record.fingerprint != request.fingerprint:
        raise Problem(
            422,
            "Idempotency-Key reused",
            "this Idempotency-Key was already used for a different request",
            slug="idempotency-key-reused",
        )
    return StoredResponse(record.status_code, record.body, record.location)


def remember(
    session: Session,
    tenant_id: str,
    request: IdempotencyRequest | None,
    response: StoredResponse,
) -> None:
    """Stage the response in the caller's transaction (commits with the resource it created)."""
    if request is None:
        return
    session.add(
        IdempotencyRecord(
            tenant_id=tenant_id,
            key=request.key,
            fingerprint=request.fingerprint,
            status_code=response.status_code,
            body=response.body,
            location=response.location,
        )
    )


def create_once(
    session: Session,
    tenant_id: str,
    request: IdempotencyRequest | None,
    create: Callable[[], StoredResponse],
) -> tuple[StoredResponse, bool]:
    """Replay a retried request, or run ``create`` (which stages a resource) and commit it with
    its response. Returns the response and whether this call created the resource."""
    replay = find_replay(session, tenant_id, request)
    if replay is not None:
        return replay, False
    response = create()
    remember(session, tenant_id, request, response)
    session.commit()
    return response, True


def stored_json(stored: StoredResponse) -> JSONResponse:
    headers = {"Location": stored.location} if stored.location else None
    return JSONResponse(stored.body, status_code=stored.status_code, headers=headers)
