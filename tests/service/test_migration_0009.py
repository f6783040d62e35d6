"""Revision 0009 on SQLite and PostgreSQL: a re-embedded item's features may be NULL (an attached
Qdrant collection holds them), existing rows keep theirs, and downgrading refuses while a row
without features exists, then restores the NOT NULL column and keeps every row."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect, text

from tests.service.test_migration_0008 import GALLERY
from tests.service.test_migrations import (  # noqa: F401  (fresh_url: the fixture)
    fresh_url,
    upgraded_with_a_tenant,
)

MODEL = (
    "INSERT INTO models (id, tenant_id, kind, method, root_id, depth, modalities, input_dims, "
    "output_dim, curv, artifact_path, artifact_sha256, artifact_bytes, created_at) VALUES "
    "('mdl_1', 't', 'backbone', 'procrustes', 'mdl_1', 0, '[\"default\"]', '{\"default\": 4}', "
    "4, 1.0, 'a', 'x', 0, :now)"
)
ROW = (
    "INSERT INTO gallery_reembedded (gallery_id, model_id, vector_id, features, updated_at) "
    "VALUES (:gallery, 'mdl_1', :vector, :features, :now)"
)


def features_nullable(connection) -> bool:
    columns = inspect(connection).get_columns("gallery_reembedded")
    return next(c for c in columns if c["name"] == "features")["nullable"]


def test_features_become_nullable_and_come_back(fresh_url: str) -> None:  # noqa: F811
    config, engine, now = upgraded_with_a_tenant(fresh_url, "0008")
    blob = b"\x00" * 16
    try:
        with engine.begin() as connection:
            connection.execute(text(GALLERY), {"id": "gal_s", "storage": "segments", "now": now})
            connection.execute(text(GALLERY), {"id": "gal_q", "storage": "qdrant", "now": now})
            connection.execute(text(MODEL), {"now": now})
            connection.execute(
                text(ROW), {"gallery": "gal_s", "vector": 1, "features": blob, "now": now}
            )
            assert not features_nullable(connection)
        command.upgrade(config, "0009")
        with engine.begin() as connection:
            assert features_nullable(connection)
            kept = connection.execute(text("SELECT features FROM gallery_reembedded")).scalar()
            assert bytes(kept) == blob
            connection.execute(
                text(ROW), {"gallery": "gal_q", "vector": 2**62 + 3, "features": None, "now": now}
            )
        with pytest.raises(Exception, match=r"attached Qdrant"):
            command.downgrade(config, "0008")
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM gallery_reembedded WHERE features IS NULL"))
        command.downgrade(config, "0008")
        with engine.connect() as connection:
            assert not features_nullable(connection)
            rows = connection.execute(text("SELECT gallery_id FROM gallery_reembedded")).all()
            assert [r[0] for r in rows] == ["gal_s"]
        command.upgrade(config, "head")
    finally:
        engine.dispose()
