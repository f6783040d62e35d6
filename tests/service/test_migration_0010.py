"""Revision 0010 on SQLite and PostgreSQL: ``attached_owners`` is created and filled from the
galleries already attached to servers (the earliest gallery's tenant owns its collection; two
spellings of one server are one collection; embedded stores and other galleries give no row);
downgrading drops the table and keeps every gallery."""

from __future__ import annotations

import json
from datetime import timedelta

from alembic import command
from sqlalchemy import inspect, text

from tests.service.test_migrations import (  # noqa: F401  (fresh_url: the fixture)
    fresh_url,
    upgraded_with_a_tenant,
)

GALLERY = (
    "INSERT INTO galleries (id, tenant_id, name, dim, lift_curv, index_kind, index_params, "
    "count, index_version, vector_storage, source, created_at, updated_at) "
    "VALUES (:id, :tenant, :id, 4, 1.0, 'flat', '{}', 0, 0, :storage, :source, :at, :at)"
)


def test_owners_come_from_the_earliest_attach_and_go(fresh_url: str) -> None:  # noqa: F811
    config, engine, now = upgraded_with_a_tenant(fresh_url, "0009")
    qdrant = {"engine": "qdrant", "collection": "c", "vector": None}
    galleries = [
        # (id, tenant, storage, source, minutes after now)
        ("gal_late", "t2", "qdrant", {**qdrant, "url": "http://Q:6333/x/.."}, 5),
        ("gal_first", "t", "qdrant", {**qdrant, "url": "http://q:6333"}, 1),
        ("gal_other", "t2", "qdrant", {**qdrant, "url": "http://q:6333", "collection": "d"}, 2),
        ("gal_path", "t2", "qdrant", {**qdrant, "path": "c"}, 0),
        (
            "gal_mv",
            "t2",
            "milvus_attached",
            {"engine": "milvus", "uri": "http://m:19530", "collection": "c"},
            3,
        ),
        ("gal_plain", "t", "segments", None, 0),
    ]
    try:
        with engine.begin() as connection:
            connection.execute(
                text("INSERT INTO tenants (id, name, created_at) VALUES ('t2', 't2', :now)"),
                {"now": now},
            )
            for gallery_id, tenant, storage, source, minutes in galleries:
                connection.execute(
                    text(GALLERY),
                    {
                        "id": gallery_id,
                        "tenant": tenant,
                        "storage": storage,
                        "source": None if source is None else json.dumps(source),
                        "at": now + timedelta(minutes=minutes),
                    },
                )
        command.upgrade(config, "0010")
        with engine.connect() as connection:
            owners = connection.execute(
                text("SELECT engine, place, collection, tenant_id FROM attached_owners")
            ).all()
        assert sorted(tuple(row) for row in owners) == [
            ("milvus", "http://m:19530", "c", "t2"),
            ("qdrant", "http://q:6333", "c", "t"),
            ("qdrant", "http://q:6333", "d", "t2"),
        ]
        command.downgrade(config, "0009")
        with engine.connect() as connection:
            assert "attached_owners" not in inspect(connection).get_table_names()
            kept = connection.execute(text("SELECT count(*) FROM galleries")).scalar()
            assert kept == len(galleries)
        command.upgrade(config, "head")
    finally:
        engine.dispose()
