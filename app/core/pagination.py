"""Cursor pagination: ids are time-ordered, so the cursor is the last id seen (opaque to clients)."""

from __future__ import annotations

import base64
import binascii
from typing import Any, TypeVar

from sqlalchemy import Select
from sqlalchemy.orm import Session

from app.core.errors import invalid

T = TypeVar("T")


def encode_token(last_id: str) -> str:
    return base64.urlsafe_b64encode(last_id.encode()).decode().rstrip("=")


def decode_token(token: str) -> str:
    try:
        padded = token + "=" * (-len(token) % 4)
        value = base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise invalid("page_token", "not a token this service issued") from exc
    if not value or len(value) > 64 or not value.isprintable():
        raise invalid("page_token", "not a token this service issued")
    return value


def paginate(
    session: Session, query: Select[Any], id_column: Any, page_token: str | None, limit: int
) -> tuple[list[Any], str | None]:
    """One page of ``query`` ordered by ``id_column`` and the token of the next page (or None)."""
    if page_token is not None:
        query = query.where(id_column > decode_token(page_token))
    rows = list(session.scalars(query.order_by(id_column).limit(limit + 1)))
    if len(rows) > limit:
        return rows[:limit], encode_token(rows[limit - 1].id)
    return rows, None
