"""API keys: ``nbk_`` + 256 random bits, stored as SHA-256 digests, compared by digest."""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "nbk_"


def generate_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def display_prefix(key: str) -> str:
    """Enough of a key to recognise it in a listing, too little to use it."""
    return key[: len(KEY_PREFIX) + 4]


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, ``None`` otherwise."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
