"""gallery re-embedded features and backfill fits: a new backbone's features per gallery item
and model (partial backfill), and each model's planner and reference documents

Existing galleries hold no re-embedded items. Downgrading drops every re-embedded feature and fit.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 07:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "backfill_fits",
        sa.Column("model_id", sa.String(length=40), nullable=False),
        sa.Column("fit", sa.JSON(), nullable=False),
        sa.Column("reference", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_backfill_fits_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("model_id", name=op.f("pk_backfill_fits")),
    )
    op.create_table(
        "gallery_reembedded",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("gallery_id", sa.String(length=40), nullable=False),
        sa.Column("model_id", sa.String(length=40), nullable=False),
        sa.Column(
            "vector_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("features", sa.LargeBinary(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["gallery_id"],
            ["galleries.id"],
            name=op.f("fk_gallery_reembedded_gallery_id_galleries"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_gallery_reembedded_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["vector_id"],
            ["gallery_vectors.id"],
            name=op.f("fk_gallery_reembedded_vector_id_gallery_vectors"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gallery_reembedded")),
        sa.UniqueConstraint(
            "model_id", "vector_id", name=op.f("uq_gallery_reembedded_model_id_vector_id")
        ),
    )
    op.create_index(
        "ix_gallery_reembedded_gallery_model",
        "gallery_reembedded",
        ["gallery_id", "model_id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_gallery_reembedded_vector_id"), "gallery_reembedded", ["vector_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_gallery_reembedded_vector_id"), table_name="gallery_reembedded")
    op.drop_index("ix_gallery_reembedded_gallery_model", table_name="gallery_reembedded")
    op.drop_table("gallery_reembedded")
    op.drop_table("backfill_fits")
