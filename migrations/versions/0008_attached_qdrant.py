"""attached qdrant: a gallery can read a Qdrant collection instead of storing vectors

``galleries.source`` names the attached collection (NULL for every other gallery, so existing
galleries are untouched); ``attached_point_ids`` maps the points whose ids cannot serve as
internal ids (UUIDs, integers ≥ 2⁶²) to internal ids, ids only. Downgrading refuses while a
gallery is attached: below 0008 nothing could read it, and deleting it would lose its datasets'
pairing silently.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-10 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("galleries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("source", sa.JSON(), nullable=True))
    op.create_table(
        "attached_point_ids",
        sa.Column("gallery_id", sa.String(length=40), nullable=False),
        sa.Column("vector_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("point_id", sa.String(length=40), nullable=False),
        sa.ForeignKeyConstraint(
            ["gallery_id"],
            ["galleries.id"],
            name=op.f("fk_attached_point_ids_gallery_id_galleries"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("gallery_id", "vector_id", name=op.f("pk_attached_point_ids")),
        sa.UniqueConstraint(
            "gallery_id", "point_id", name=op.f("uq_attached_point_ids_gallery_id_point_id")
        ),
    )


def downgrade() -> None:
    attached = op.get_bind().execute(
        sa.text("SELECT count(*) FROM galleries WHERE vector_storage = 'qdrant'")
    ).scalar()
    if attached:
        raise RuntimeError(
            f"{attached} galleries are attached Qdrant collections; delete them before "
            "downgrading below 0008"
        )
    op.drop_table("attached_point_ids")
    with op.batch_alter_table("galleries", schema=None) as batch_op:
        batch_op.drop_column("source")
