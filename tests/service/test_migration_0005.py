"""Revision 0005 on SQLite and PostgreSQL: every key that existed becomes an admin key (they
were made by ``nobackfill create-key`` or are the local or bootstrap key, each able to do
anything its tenant can), a row written without the flag is not one, and downgrading keeps the
keys."""

from __future__ import annotations

from datetime import UTC, datetime

from alembic import command
from sqlalchemy import Connection, inspect, text

from tests.service.test_migrations import (  # noqa: F401  (fresh_url: the fixture)
    fresh_url,
    upgraded_with_a_tenant,
)


def insert_key(
    connection: Connection, key_id: str, revoked_at: datetime | None, now: datetime
) -> None:
    connection.execute(
        text(
            "INSERT INTO api_keys (id, tenant_id, key_hash, prefix, name, created_at, revoked_at) "
            "VALUES (:id, 't', :digest, 'nbk_abcd', :id, :now, :revoked_at)"
        ),
        {"id": key_id, "digest": key_id.ljust(64, "0"), "now": now, "revoked_at": revoked_at},
    )


def test_existing_keys_become_admin_keys(fresh_url: str) -> None:  # noqa: F811
    config, engine, now = upgraded_with_a_tenant(fresh_url, "0004")
    try:
        with engine.begin() as connection:
            insert_key(connection, "key_local", None, now)
            insert_key(connection, "key_old", datetime(2026, 1, 1, tzinfo=UTC), now)
        command.upgrade(config, "0005")
        with engine.begin() as connection:
            rows = connection.execute(text("SELECT id, admin FROM api_keys ORDER BY id")).all()
            assert [(r[0], bool(r[1])) for r in rows] == [("key_local", True), ("key_old", True)]
            # A writer that does not know the flag (an older process mid-upgrade) makes a key
            # that is no admin key: the default grants nothing.
            insert_key(connection, "key_new", None, now)
            admin = connection.execute(text("SELECT admin FROM api_keys WHERE id = 'key_new'"))
            assert bool(admin.scalar()) is False
        command.downgrade(config, "0004")
        with engine.connect() as connection:
            columns = {c["name"] for c in inspect(connection).get_columns("api_keys")}
            assert "admin" not in columns
            ids = connection.execute(text("SELECT id FROM api_keys ORDER BY id")).scalars().all()
            assert ids == ["key_local", "key_new", "key_old"]
        command.upgrade(config, "head")
    finally:
        engine.dispose()
