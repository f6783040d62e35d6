"""Key lifecycle: an admin key creates, lists and revokes its tenant's keys (database only).

A tenant can never lock itself out: its last active admin key cannot be revoked. Revocations of
one tenant are serialised on the tenant's row, so two concurrent ones cannot each see the other
admin key still active and both go through."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.auth.models import ApiKey, Tenant
from app.auth.service import new_key_row
from app.core.db import utcnow
from app.core.errors import Problem, conflict
from app.core.pagination import paginate
from app.core.security import generate_api_key, hash_api_key
from app.core.tenancy import get_owned


def is_admin_key(session: Session, key: str) -> bool:
    """Whether ``key`` is a valid, unrevoked admin key."""
    admin = session.scalar(
        select(ApiKey.admin).where(
            ApiKey.key_hash == hash_api_key(key), ApiKey.revoked_at.is_(None)
        )
    )
    return bool(admin)


def create_key(
    session: Session, tenant_id: str, name: str, admin: bool, max_keys: int
) -> tuple[ApiKey, str]:
    """A new key of the tenant, committed; returns its row and the key itself, which is stored
    nowhere (only its digest is) and so can be shown only now."""
    active = session.scalar(
        select(func.count()).where(ApiKey.tenant_id == tenant_id, ApiKey.revoked_at.is_(None))
    )
    if (active or 0) >= max_keys:
        raise Problem(
            403,
            "Limit reached",
            f"this tenant has {active} active API keys, the limit is {max_keys} "
            "(NOBACKFILL_MAX_KEYS_PER_TENANT); revoke one first",
            slug="limit-reached",
        )
    key = generate_api_key()
    row = new_key_row(tenant_id, key, name, admin=admin)
    session.add(row)
    session.commit()
    return row, key


def list_keys(
    session: Session,
    tenant_id: str,
    *,
    include_revoked: bool,
    page_token: str | None,
    limit: int,
    max_page_size: int,
) -> tuple[list[ApiKey], str | None]:
    """One page of the tenant's keys, oldest first (ids are time-ordered)."""
    query = select(ApiKey).where(ApiKey.tenant_id == tenant_id)
    if not include_revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    return paginate(session, query, ApiKey.id, page_token, min(limit, max_page_size))


def _lock_tenant(session: Session, tenant_id: str) -> None:
    """Hold the tenant's row for this transaction. SQLite has no row locks: a no-op UPDATE takes
    the database's write lock (writers in other processes wait here too)."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(
            update(Tenant)
            .where(Tenant.id == tenant_id)
            .values(name=Tenant.name)
            .execution_options(synchronize_session=False)
        )
    session.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())


def revoke_key(session: Session, tenant_id: str, key_id: str) -> ApiKey:
    """Revoke the tenant's key ``key_id`` (404 for any other tenant's); an already revoked key
    keeps its first ``revoked_at``. 409 for the tenant's last active admin key."""
    _lock_tenant(session, tenant_id)
    key = get_owned(session, ApiKey, tenant_id, key_id, "API key")
    if key.revoked_at is None:
        if key.admin and _active_admins(session, tenant_id, besides=key.id) == 0:
            raise conflict(
                f"{key.id} is this tenant's last active admin key: create another admin key "
                "(POST /v1/keys with admin: true) before revoking it"
            )
        key.revoked_at = utcnow()
    session.commit()
    return key


def _active_admins(session: Session, tenant_id: str, *, besides: str) -> int:
    count = session.scalar(
        select(func.count()).where(
            ApiKey.tenant_id == tenant_id,
            ApiKey.admin.is_(True),
            ApiKey.revoked_at.is_(None),
            ApiKey.id != besides,
        )
    )
    return count or 0


def key_out(key: ApiKey) -> dict[str, Any]:
    """A key as the API shows it: never the secret (which is not stored) nor its digest."""
    return {
        "id": key.id,
        "prefix": key.prefix,
        "name": key.name,
        "admin": key.admin,
        "created_at": key.created_at,
        "revoked_at": key.revoked_at,
    }
