"""attached owners: a collection on a shared server belongs to the tenant that attached it

``attached_owners`` records, per collection of a Qdrant or Milvus server (engine, the server's
normalised place, the collection), the tenant that attached it; another tenant's attach of it is
refused unless the operator lists the server as shared (``NOBACKFILL_ATTACH_SHARED_URLS``).
Existing attached galleries on servers give their collections' owners: the earliest gallery's
tenant. (Embedded stores need no row: from this revision each tenant reads only its own folder
under the attach roots, and a gallery attached from a shared folder before it must be attached
again from the tenant's folder.) Downgrading drops the table and nothing else.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 09:00:00.000000
"""

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from app.vectors.source_rules import owner_key, server_collection

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    owners = op.create_table(
        "attached_owners",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("engine", sa.String(length=16), nullable=False),
        sa.Column("place", sa.String(length=2100), nullable=False),
        sa.Column("collection", sa.String(length=255), nullable=False),
        sa.Column("tenant_id", sa.String(length=40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
            name=op.f("fk_attached_owners_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_attached_owners")),
    )
    with op.batch_alter_table("attached_owners", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_attached_owners_tenant_id"), ["tenant_id"])
    galleries = sa.table(
        "galleries",
        sa.column("tenant_id", sa.String),
        sa.column("source", sa.JSON),
        sa.column("created_at", sa.DateTime),
        sa.column("id", sa.String),
    )
    rows = op.get_bind().execute(
        sa.select(galleries.c.tenant_id, galleries.c.source)
        .where(galleries.c.source.is_not(None))
        .order_by(galleries.c.created_at, galleries.c.id)
    )
    claimed: dict[str, dict] = {}
    for tenant_id, source in rows:
        found = server_collection(source or {})
        if found is None:
            continue
        key = owner_key(*found)
        if key not in claimed:  # the earliest attach owns it
            engine, place, collection = found
            claimed[key] = {
                "key": key,
                "engine": engine,
                "place": place,
                "collection": collection,
                "tenant_id": tenant_id,
                "created_at": datetime.now(UTC),
            }
    if claimed:
        op.bulk_insert(owners, list(claimed.values()))


def downgrade() -> None:
    with op.batch_alter_table("attached_owners", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_attached_owners_tenant_id"))
    op.drop_table("attached_owners")
