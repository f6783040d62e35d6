"""Tenants and API keys: create, resolve, and the local key of the embedded mode."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.auth.models import ApiKey, Tenant
from app.core.db import Database, new_id, utcnow
from app.core.security import display_prefix, generate_api_key, hash_api_key
from app.core.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CreatedKey:
    tenant_id: str
    tenant_name: str
    key: str


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        tenant = Tenant(id=new_id("ten"), name=name)
        session.add(tenant)
        session.flush()
    return tenant


def new_key_row(tenant_id: str, key: str, name: str = "", *, admin: bool) -> ApiKey:
    """The row that stands for ``key``: its digest and display prefix, never the key."""
    return ApiKey(
        id=new_id("key"),
        tenant_id=tenant_id,
        key_hash=hash_api_key(key),
        prefix=display_prefix(key),
        name=name,
        admin=admin,
    )


def add_key(
    session: Session, tenant: Tenant, key: str, name: str = "", *, admin: bool = False
) -> ApiKey:
    """Register ``key`` for ``tenant`` (idempotent for a key already registered to it: its
    flags, and a revocation, stay as they are)."""
    existing = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_api_key(key)))
    if existing is not None:
        if existing.tenant_id != tenant.id:
            raise ValueError("this key already belongs to another tenant")
        return existing
    api_key = new_key_row(tenant.id, key, name, admin=admin)
    session.add(api_key)
    session.flush()
    return api_key


def create_key(session: Session, tenant_name: str, key_name: str = "") -> CreatedKey:
    """``nobackfill create-key``: an admin key, since whoever runs it holds the database and
    could do anything anyway; it is how a tenant gets its first key."""
    tenant = get_or_create_tenant(session, tenant_name)
    key = generate_api_key()
    add_key(session, tenant, key, key_name, admin=True)
    return CreatedKey(tenant.id, tenant.name, key)


def tenant_for_key(session: Session, key: str) -> str | None:
    """The tenant id of a valid, unrevoked key, else ``None``."""
    return session.scalar(
        select(ApiKey.tenant_id).where(
            ApiKey.key_hash == hash_api_key(key), ApiKey.revoked_at.is_(None)
        )
    )


@dataclass(frozen=True)
class LocalKey:
    """The embedded mode's key, and whether this start registered it (then, and only then, it
    is printed in full: later starts would put it in every log that keeps the console)."""

    key: str
    created: bool
    source: str  # "NOBACKFILL_BOOTSTRAP_KEY" or the key file's path


def ensure_local_key(db: Database, settings: Settings) -> LocalKey | None:
    """The embedded mode's key: ``NOBACKFILL_BOOTSTRAP_KEY`` if set, else the key stored in
    ``<data_dir>/api_key`` (created on first start, mode 0600); ``None`` when neither applies
    (compose: keys come from the CLI). A bootstrap key that changed revokes the previous
    bootstrap keys of the local tenant: rotating the variable and restarting rotates the key."""
    if settings.bootstrap_key:
        key, name, source = settings.bootstrap_key, "bootstrap", "NOBACKFILL_BOOTSTRAP_KEY"
    elif settings.local_key:
        name, path = "local", settings.local_key_file
        source = str(path)
        if path.exists():
            key = path.read_text(encoding="utf-8").strip()
        else:
            key = generate_api_key()
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(key + "\n")
            log.info("created the local API key in %s", path)
    else:
        return None
    with db.session() as session:
        tenant = get_or_create_tenant(session, settings.local_tenant)
        digest = hash_api_key(key)
        known = session.scalar(select(ApiKey).where(ApiKey.key_hash == digest))
        # The operator's own key: it manages the tenant's other keys.
        add_key(session, tenant, key, name, admin=True)
        if name == "bootstrap":
            earlier = session.scalars(
                select(ApiKey).where(
                    ApiKey.tenant_id == tenant.id,
                    ApiKey.name == "bootstrap",
                    ApiKey.key_hash != digest,
                    ApiKey.revoked_at.is_(None),
                )
            ).all()
            for old in earlier:
                old.revoked_at = utcnow()
                log.warning("revoked the previous bootstrap key %s…", old.prefix)
    return LocalKey(key, known is None, source)
