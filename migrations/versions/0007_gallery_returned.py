"""gallery returned: the service's own tally of what its searches returned, by item

One row per (gallery, internal vector id) that a search has returned, its weight the sum of
1 / rank over every search that returned it. A weaker signal than access counts (a returned item
is often not the one the user wanted); the backfill plan uses it only where its own validation
against the access counts says it helps. A new table, so existing data is untouched; downgrading
drops the tally (below 0007 nothing reads it).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 11:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gallery_returned",
        sa.Column("gallery_id", sa.String(length=40), nullable=False),
        sa.Column("vector_id", sa.BigInteger(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["gallery_id"],
            ["galleries.id"],
            name=op.f("fk_gallery_returned_gallery_id_galleries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("gallery_id", "vector_id", name=op.f("pk_gallery_returned")),
    )


def downgrade() -> None:
    op.drop_table("gallery_returned")
