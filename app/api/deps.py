"""Request dependencies: service state, database session, tenant (and admin key),
Idempotency-Key."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.auth.throttle import AuthThrottle
from app.core.db import Database
from app.core.errors import Problem, database_outage, log_outage
from app.core.idempotency import IdempotencyRequest
from app.core.settings import Settings
from app.core.storage import StorageHealth
from app.embedders.guard import EmbeddingGuards
from app.migration.returned import ReturnedTally

if TYPE_CHECKING:
    from app.models.service import ModelCache
    from app.upgrades.runner import JobRunner
    from app.vectors.faiss.index_store import IndexStore


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
    # Whether the data directory took its last write (a full disk: writes 507, /readyz says so).
    storage: StorageHealth | None = None


def get_state(request: Request) -> ServiceState:
    return request.app.state.service


StateDep = Annotated[ServiceState, Depends(get_state)]


def get_session(state: StateDep) -> Iterator[Session]:
    """One session per request; services commit explicitly, anything left is rolled back. A
    rollback the database cannot take now (it stopped answering after the request's last
    statement) is given up: its connection is dropped already, nothing uncommitted survives
    that, and the request's answer — ready, perhaps sent — stands (raising here lost it)."""
    with state.db.sessions() as session:
        try:
            yield session
        finally:
            try:
                session.rollback()
            except Exception as exc:
                if database_outage(exc) is None:
                    raise
                log_outage("request session: the database did not take its rollback: %s", exc)


SessionDep = Annotated[Session, Depends(get_session)]

# Characters of a presented key its failures are counted under (a key guesser who rotates
# addresses still repeats its keys' prefixes; a real key's own prefix is 12 characters long).
KEY_PREFIX_CHARS = 12
_bearer = HTTPBearer(auto_error=False, description="an API key: `Authorization: Bearer <key>`")


def authenticate(
    state: ServiceState,
    client: str,
    presented: str | None,
    lookup: Callable[[str], str | None],
    count_failure: Callable[[str], None],
) -> str:
    """The tenant of a presented key, or a Problem (401, or 429 while its address or its key
    prefix is throttled). ``lookup`` finds a key's tenant (``tenant_for_key`` in a short
    session); ``count_failure`` counts a failure's reason for /metrics. Shared by the route
    dependency and the body guard, which calls it before reading any body."""
    unauthorized = {"WWW-Authenticate": "Bearer"}
    if presented is not None:
        tenant_id = lookup(presented)
        if tenant_id is not None:
            # A valid key is never refused because others failed from its address (behind a
            # proxy or NAT, every tenant shares one).
            return tenant_id
    # A failure: throttled per address and per presented key prefix, each on its own count.
    prefix = "key:" + (presented or "")[:KEY_PREFIX_CHARS]
    wait = max(
        (w for w in (state.throttle.retry_after(client), state.throttle.retry_after(prefix)) if w),
        default=None,
    )
    if wait is not None:
        count_failure("throttled")
        raise Problem(
            429,
            "Too many requests",
            f"too many failed authentications from this address or with this key; retry in "
            f"{wait} s",
            slug="too-many-failed-authentications",
            headers={"Retry-After": str(wait)},
        )
    state.throttle.failed(client)
    if presented:
        state.throttle.failed(prefix)
    if presented is None:
        count_failure("missing")
        raise Problem(
            401,
            "Unauthorized",
            "send an API key as `Authorization: Bearer <key>`",
            headers=unauthorized,
        )
    count_failure("unknown key")
    raise Problem(401, "Unauthorized", "unknown or revoked API key", headers=unauthorized)


def get_tenant_id(
    request: Request,
    state: StateDep,
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    from app.auth.service import tenant_for_key

    def lookup(key: str) -> str | None:
        tenant_id = tenant_for_key(session, key)
        # End the key lookup's transaction: its connection goes back to the pool now, not when
        # the request ends — a request still waiting for its body (or a slow client) must hold
        # none. Nothing loaded is expired (expire_on_commit=False).
        session.commit()
        return tenant_id

    # The connection's peer (uvicorn rewrites it from X-Forwarded-For only for the proxies in
    # NOBACKFILL_TRUSTED_PROXIES): a client cannot pick the address it is throttled by.
    client = request.client.host if request.client else "unknown"
    presented = None
    if credentials is not None and credentials.scheme.lower() == "bearer":
        presented = credentials.credentials
    return authenticate(
        state, client, presented, lookup, lambda reason: _count_auth_failure(request, reason)
    )


def _count_auth_failure(request: Request, reason: str) -> None:
    count_auth_failure(request.app, reason)


def count_auth_failure(app: Any, reason: str) -> None:
    metrics = getattr(app.state, "metrics", None)
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
