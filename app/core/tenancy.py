"""Every resource belongs to one tenant: lookups, per-tenant limits, names, list pages."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from sqlalchemy import column, func, select, table, update
from sqlalchemy.orm import Session

from app.core.errors import Problem, conflict, not_found
from app.core.pagination import paginate

T = TypeVar("T")
# Every id this service issues (``new_id``) matches this; anything else cannot exist, and is not
# sent to the database at all (PostgreSQL refuses text with NUL bytes with an error, not a miss).
POSSIBLE_ID = re.compile(r"[A-Za-z0-9_]{1,64}")


def get_owned(session: Session, model: type[T], tenant_id: str, resource_id: str, kind: str) -> T:
    """The tenant's resource; another tenant's answers exactly like a missing one (404)."""
    if not POSSIBLE_ID.fullmatch(resource_id):
        raise not_found(kind, resource_id)
    row = session.scalar(
        select(model).where(model.id == resource_id, model.tenant_id == tenant_id)  # type: ignore[attr-defined]
    )
    if row is None:
        raise not_found(kind, resource_id)
    return row


# The tenants table, named here without its model (app.auth sits above app.core): what
# ``lock_tenant`` locks.
_tenants = table("tenants", column("id"), column("name"))


def lock_tenant(session: Session, tenant_id: str) -> None:
    """Serialise this transaction with the tenant's other writers until it ends: a row lock on
    PostgreSQL; on SQLite, which has no row locks and starts a transaction at its first write, a
    no-op UPDATE that takes the database's write lock first."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(
            update(_tenants).where(_tenants.c.id == tenant_id).values(name=_tenants.c.name)
        )
    # FOR NO KEY UPDATE: it queues the tenant's other creates (and job claims, which take the
    # same), but not inserts elsewhere that only reference the tenant (their FOR KEY SHARE).
    session.execute(
        select(_tenants.c.id).where(_tenants.c.id == tenant_id).with_for_update(key_share=True)
    )


def check_tenant_limit(
    session: Session, model: type, tenant_id: str, limit: int, what: str, setting: str
) -> None:
    """403 when the tenant holds ``limit`` rows of ``model`` already. The count is taken under
    the tenant's lock (``lock_tenant``), held until the caller's insert commits: racing creates
    count one after another, so none of them passes a count the others are about to change."""
    lock_tenant(session, tenant_id)
    count = session.scalar(select(func.count()).where(model.tenant_id == tenant_id)) or 0
    if count >= limit:
        raise Problem(
            403,
            "Limit reached",
            f"this tenant has {count} {what}, the limit is {limit} (NOBACKFILL_{setting.upper()})",
            slug="limit-reached",
        )


def check_name_free(session: Session, model: type, tenant_id: str, name: str) -> None:
    taken = session.scalar(select(model.id).where(model.tenant_id == tenant_id, model.name == name))
    if taken is not None:
        raise conflict(f"name {name!r} is already used by {taken}")


def tenant_page(
    session: Session,
    model: type,
    tenant_id: str,
    page_token: str | None,
    limit: int,
    max_page_size: int,
) -> tuple[list[Any], str | None]:
    return paginate(
        session,
        select(model).where(model.tenant_id == tenant_id),
        model.id,
        page_token,
        min(limit, max_page_size),
    )
