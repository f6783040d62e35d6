"""gallery access: per-item access counts (what users opened or clicked), for the backfill plan

One row per (gallery, item id) that has a count; ``vector_id`` is the item's internal id, so the
plan lines counts up with the gallery's points. A new table, so existing data is untouched;
downgrading drops the counts (below 0006 nothing reads them).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gallery_access",
        sa.Column("gallery_id", sa.String(length=40), nullable=False),
        sa.Column("item_id", sa.String(length=256), nullable=False),
        sa.Column("vector_id", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["gallery_id"],
            ["galleries.id"],
            name=op.f("fk_gallery_access_gallery_id_galleries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("gallery_id", "item_id", name=op.f("pk_gallery_access")),
    )


def downgrade() -> None:
    op.drop_table("gallery_access")
