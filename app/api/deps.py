"""Request dependencies: service state, database session, tenant (and admin key),
Idempotency-Key."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.auth.throttle import AuthThrottle
from app.core.db import Database
from app.core.errors import Problem
from app.core.idempotency import IdempotencyRequest
from app.core.settings import Settings
from app.embedders.guard import EmbeddingGuards
from app.migration.returned import ReturnedTally

if TYPE_CHECKING:
    from app.models.service import ModelCache
    from app.upgrades.runner import JobRunner
    from app.vectors.index_store import IndexStore


@dataclass
class ServiceState:
    """Everything the lifespan builds once and every request shares."""

    settings: Settings
    db: Database
    indexes: IndexStore
    models: ModelCache
    runner: JobRunner
    throttle: AuthThrottle = field(default_factory=lambda: AuthThrottle(20, 60.0))
    # What searches returned, tallied for the backfill plan (off unless built from settings).
    returned: ReturnedTally = field(default_factory=lambda: ReturnedTally(False, 0))
    # Two-stage search's embedder circuits and per-tenant embedding budgets.
    embedding: EmbeddingGuards = field(default_factory=lambda: EmbeddingGuards(3, 30.0, 20_000))


def get_state(request: Request) -> ServiceState:
    return request.app.state.service


StateDep = Annotated[ServiceState, Depends(get_state)]


def get_session(state: StateDep) -> Iterator[Session]:
    """One session per request; services commit explicitly, anything left is rolled back."""
    with state.db.sessions() as session:
        try:
            yield session
        finally:
            session.rollback()


SessionDep = Annotated[Session, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False, description="an API key: `Authorization: Bearer <key>`")


def get_tenant_id(
    request: Request,
    state: StateDep,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    from app.auth.service import tenant_for_key

    unauthorized = {"WWW-Authenticate": "Bearer"}
    client = request.client.host if request.client else "unknown"
    wait = state.throttle.retry_after(client)
    if wait is not None:
        # Checked before the key: a client guessing keys learns nothing more until it waits.
        _count_auth_failure(request, "throttled")
        raise Problem(
            429,
            "Too many requests",
            f"too many failed authentications from this address; retry in {wait} s",
            slug="too-many-failed-authentications",
            headers={"Retry-After": str(wait)},
        )
    if credentials is None or credentials.scheme.lower() != "bearer":
        state.throttle.failed(client)
        _count_auth_failure(request, "missing")
        raise Problem(
            401,
            "Unauthorized",
            "send an API key as `Authorization: Bearer <key>`",
            headers=unauthorized,
        )
    tenant_id = tenant_for_key(session, credentials.credentials)
    # End the key lookup's transaction: its connection goes back to the pool now, not when the
    # request ends — a request still waiting for its body (or a slow client) must hold none.
    # Nothing loaded is expired (expire_on_commit=False); the route's own queries start afresh.
    session.commit()
    if tenant_id is None:
        state.throttle.failed(client)
        _count_auth_failure(request, "unknown key")
        raise Problem(401, "Unauthorized", "unknown or revoked API key", headers=unauthorized)
    return tenant_id


def _count_auth_failure(request: Request, reason: str) -> None:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.auth_failures.labels(reason).inc()


TenantDep = Annotated[str, Depends(get_tenant_id)]


def get_admin_tenant_id(
    session: SessionDep,
    tenant_id: TenantDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The tenant of an admin key; any other valid key answers 403 (an invalid one got its 401
    from ``get_tenant_id`` already, with the same credentials: FastAPI solves each once)."""
    from app.auth.keys import is_admin_key

    admin = credentials is not None and is_admin_key(session, credentials.credentials)
    session.commit()  # as after the tenant's lookup: no connection held past the key checks
    if not admin:
        raise Problem(
            403,
            "Forbidden",
            "this API key is not an admin key: only admin keys create, list or revoke keys",
            slug="admin-key-required",
        )
    return tenant_id


AdminTenantDep = Annotated[str, Depends(get_admin_tenant_id)]


async def get_idempotency(
    request: Request,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="retrying with the same key and body replays the first response",
            max_length=255,
        ),
    ] = None,
) -> IdempotencyRequest | None:
    body = await request.body() if idempotency_key is not None else b""
    return IdempotencyRequest.from_parts(idempotency_key, request.method, request.url.path, body)


IdempotencyDep = Annotated[IdempotencyRequest | None, Depends(get_idempotency)]
