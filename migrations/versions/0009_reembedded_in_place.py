"""re-embedded in place: a re-embedded item's features may live outside the service

``gallery_reembedded.features`` becomes nullable: NULL where an attached Qdrant collection holds
the item's new vector itself (a named vector of its point, ``app.migration.in_place``); the row
still counts the item for the plan, progress and deletes. Every existing row keeps its features.
Downgrading refuses while such a row exists: below 0009 a row must carry its features, and
dropping the rows would forget re-embedded items silently.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-12 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("gallery_reembedded", schema=None) as batch_op:
        batch_op.alter_column("features", existing_type=sa.LargeBinary(), nullable=True)


def downgrade() -> None:
    in_place = op.get_bind().execute(
        sa.text("SELECT count(*) FROM gallery_reembedded WHERE features IS NULL")
    ).scalar()
    if in_place:
        raise RuntimeError(
            f"{in_place} re-embedded items live in attached Qdrant collections; delete them "
            "(or their galleries) before downgrading below 0009"
        )
    with op.batch_alter_table("gallery_reembedded", schema=None) as batch_op:
        batch_op.alter_column("features", existing_type=sa.LargeBinary(), nullable=False)
